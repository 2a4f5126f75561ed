"""What a replica's code started (a model server, a pool) does not outlive the replica: when a replica the scheduler
started ends, killed -9 or stopped, the scheduler kills what it left in its process group."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamserve import Client
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie is gone but for its parent's wait)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """The pids of the processes the replicas started, killed at the end whatever the test saw."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def deploy(client: Client, replicas: int) -> None:
    cfg = DeploymentConfig(
        name="starter",
        import_path="tests.deployments:start_sleeper",
        num_replicas=replicas,
        graceful_shutdown_timeout_s=2,
    )
    client.deploy(AppConfig(deployments=[cfg]))


def replica_pid(client: Client) -> int:
    """The pid of the one running replica, once the scheduler's record says it runs."""

    def pids() -> list[int]:
        return [r.pid for d in client.status() for r in d.replicas if r.state == "RUNNING"]

    wait_for(lambda: len(pids()) == 1, 30, lambda: f"not one running replica: {client.status()}")
    return pids()[0]


def test_a_replica_killed_9_or_stopped_leaves_no_process_of_its_own_behind(
    processes: Processes, settings: Settings, sleepers: list[int]
) -> None:
    processes.spawn("scheduler", "scheduler")
    with Client(settings.effective_redis_url) as client:
        deploy(client, 1)
        sleepers.append(client.call("starter", None, timeout=60))
        assert running(sleepers[-1])
        killed = replica_pid(client)
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: not running(sleepers[0]), 30, "a killed replica's process outlived it")

        sleepers.append(client.call("starter", None, timeout=60))  # on the replica that replaced it
        assert replica_pid(client) != killed and running(sleepers[-1])
        deploy(client, 0)  # the replica drains and exits
        wait_for(lambda: not running(sleepers[1]), 30, "a stopped replica's process outlived it")


def test_a_replica_adopted_from_a_killed_scheduler_leaves_no_process_of_its_own_behind_either(
    processes: Processes, settings: Settings, sleepers: list[int]
) -> None:
    """A scheduler killed -9 leaves its replicas running; the next one adopts them. When an adopted replica ends,
    stopped or killed -9, what its code started goes too (it outlived it: the group was swept only for the
    scheduler's own children)."""
    scheduler = processes.spawn("scheduler-1", "scheduler")
    with Client(settings.effective_redis_url) as client:
        for n, end in enumerate(("stopped", "killed")):
            deploy(client, 1)
            replica = replica_pid(client)
            scheduler.kill()
            scheduler.wait(10)
            scheduler = processes.spawn(f"scheduler-{n + 2}", "scheduler")  # it adopts the replica
            sleepers.append(client.call("starter", None, timeout=60))
            assert running(sleepers[-1])
            if end == "stopped":
                deploy(client, 0)  # the replica drains and exits
            else:
                os.kill(replica, signal.SIGKILL)
            wait_for(lambda: not running(sleepers[-1]), 30, f"an adopted replica's process outlived it ({end})")
