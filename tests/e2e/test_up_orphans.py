"""No process of a farm outlives its `streamserve up`: not after kill -9 of `up`, a closed terminal (SIGHUP), a
service manager's stop (SIGTERM), nor a Ctrl-C after the embedded Redis died first."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from streamserve.runtime.processes import port_is_free
from tests.harness.farm import Farm, farm_on, pids_with_marker
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - {name: echo, import_path: 'examples.echo:Echo', num_replicas: 2}
"""


@pytest.fixture
def farm(tmp_path: Path) -> Farm:
    return farm_on(CONFIG, tmp_path)


def replicas(farm: Farm) -> list[int]:
    return farm.role_pids().get("worker", [])


def test_kill_9_of_up_leaves_no_process_within_15_s(farm: Farm) -> None:
    farm.start()
    try:
        assert len(replicas(farm)) == 2 and farm.proc is not None
        os.kill(farm.proc.pid, signal.SIGKILL)
        farm.proc.wait(5)
        # The scheduler, gateway and Redis die with their parent; the replicas see `up` gone and leave.
        wait_for(lambda: pids_with_marker(farm.token) == [], 15, f"left behind: {farm.processes()}")
        assert farm.redis_port is not None and port_is_free("127.0.0.1", farm.redis_port)
    finally:
        farm.stop()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_hangup_and_terminate_stop_the_farm_like_ctrl_c(farm: Farm, sig: signal.Signals) -> None:
    farm.start()
    try:
        assert farm.proc is not None
        farm.proc.send_signal(sig)
        assert farm.proc.wait(40) == 0
        assert f"streamserve: {sig.name}, stopping" in farm.log().decode()
        assert pids_with_marker(farm.token) == []
    finally:
        farm.stop()


def test_ctrl_c_after_redis_died_leaves_no_replica(farm: Farm) -> None:
    farm.start()
    try:
        assert len(replicas(farm)) == 2 and farm.proc is not None
        [redis_pid] = farm.role_pids()["redis-server"]
        os.kill(redis_pid, signal.SIGKILL)
        farm.proc.send_signal(signal.SIGINT)
        farm.proc.wait(60)
        assert pids_with_marker(farm.token) == [], farm.processes()
    finally:
        farm.stop()
