"""A replica whose `streamserve up` died (its lifeline cut, runtime/lifeline.py) leaves by itself, as operations.md
says: it drains for FARM_GONE_DRAIN_S at most, whatever it runs, and what its code started goes with it, since no
scheduler is left to kill its process group. Real `streamserve worker` processes, given a lifeline the test holds."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from streamserve import Client
from streamserve.runtime.lifeline import FARM_GONE_DRAIN_S, FARM_GONE_WIND_DOWN_S, Lifeline
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat, Request, now_ms
from tests.harness.farm import Processes
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

# How long a replica whose `up` died may take to exit, at most (operations.md: "nothing is left about 7 s later"),
# and a margin for a loaded host.
EXIT_BOUND_S = FARM_GONE_DRAIN_S + FARM_GONE_WIND_DOWN_S + 3


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie is gone but for its parent's wait)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def replica_on_a_lifeline(
    processes: Processes, settings: Settings, connection: redis.Redis, cfg: DeploymentConfig, health: str = "ready"
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], None], ReplicaID]]:
    """``cfg`` deployed and one `streamserve worker` of it started as the scheduler starts one (a session of its own,
    `up`'s lifeline handed down), once its heartbeat says ``health``: the process, what cuts its lifeline (`up`
    died), its id."""
    with Client(settings.effective_redis_url) as client:
        client.deploy(AppConfig(deployments=[cfg]))
    replica_id = ReplicaID.new(cfg.name)
    lifeline = Lifeline()  # as `up` holds it: the write end stays in this process
    cut = functools.cache(lifeline.close)  # once: a second close could close a descriptor that reused its number
    try:
        with processes.log(cfg.name).open("wb") as log:
            proc = subprocess.Popen(
                [STREAMSERVE, "worker", cfg.name, "--replica-id", replica_id.to_str()],
                cwd=ROOT,
                env={**processes.env(), "STREAMSERVE_LIFELINE_FD": str(lifeline.read_fd)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lifeline.read_fd,),
            )
        processes.started[cfg.name] = proc  # killed at the end, with all it started, by the fixture

        def ready() -> bool:
            assert proc.poll() is None, processes.log(cfg.name).read_text()
            raw = connection.hget(settings.keys.heartbeats(cfg.name), replica_id.to_str())
            return raw is not None and Heartbeat.decode(raw).health == health

        wait_for(ready, 30, lambda: f"the replica did not say {health}:\n{processes.log(cfg.name).read_text()}")
        yield proc, cut, replica_id
    finally:
        cut()


def test_a_replica_running_a_redelivered_request_leaves_within_its_bounds_when_up_dies(
    processes: Processes, settings: Settings, connection: redis.Redis
) -> None:
    """A request a dead replica held, on its last delivery, is run alone (serving._run_alone), and the read loop used
    to wait for it to be finished: the drain, and its FARM_GONE_DRAIN_S, began only once it was, never when its reply
    could not be sent (Redis gone with `up`). Here its handler sleeps 60 s; the replica must not wait for it."""
    cfg = DeploymentConfig(name="redelivered", import_path="tests.deployments:crash_on")
    with replica_on_a_lifeline(processes, settings, connection, cfg) as (proc, cut, replica_id):
        # What the scheduler queues again for a replica that died holding it: its entry with an attempt counted.
        request = Request("again", "", now_ms() + 120_000, b'{"sleep": 60}', attempts=cfg.max_delivery_attempts - 1)
        connection.xadd(settings.keys.requests(cfg.name), dict(request.encode()))

        def runs_it() -> bool:
            raw = connection.hget(settings.keys.heartbeats(cfg.name), replica_id.to_str())
            return raw is not None and Heartbeat.decode(raw).ongoing == 1

        wait_for(runs_it, 30, "the replica never ran the redelivered request")
        cut()  # `up` died
        wait_for(
            lambda: proc.poll() is not None,
            EXIT_BOUND_S,
            lambda: f"the replica did not leave:\n{processes.log(cfg.name).read_text()[-3000:]}",
        )
        assert "is gone" in processes.log(cfg.name).read_text()  # it left because its lifeline was cut


@pytest.fixture
def started_by_replica() -> Iterator[list[int]]:
    """The pids of the processes a replica's code started, killed at the end whatever the test saw."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_what_a_replica_started_leaves_with_it_when_up_dies(
    processes: Processes, settings: Settings, connection: redis.Redis, started_by_replica: list[int]
) -> None:
    """The scheduler kills a replica's process group once the replica ended; when `up` died, no scheduler is left to:
    the replica ends the rest of its group itself (its constructor's process, and its handler's)."""
    cfg = DeploymentConfig(name="starter", import_path="tests.deployments:GroupStarter")
    with replica_on_a_lifeline(processes, settings, connection, cfg) as (proc, cut, _replica_id):
        with Client(settings.effective_redis_url) as client:
            started_by_replica += client.call(cfg.name, None, timeout=30)
        assert all(running(pid) for pid in started_by_replica)
        cut()  # `up` died
        wait_for(lambda: proc.poll() is not None, EXIT_BOUND_S, "the replica did not leave")
        wait_for(
            lambda: not any(running(pid) for pid in started_by_replica),
            5,
            lambda: f"what the replica started outlived it: {[p for p in started_by_replica if running(p)]}",
        )


def test_a_replica_whose_constructor_hangs_leaves_when_up_dies(
    processes: Processes, settings: Settings, connection: redis.Redis
) -> None:
    """Its constructor runs on a thread nothing can stop: the replica saw `up` was gone, and stayed for ever."""
    cfg = DeploymentConfig(name="hung", import_path="tests.deployments:SlowStart", init_kwargs={"seconds": 3600})
    with replica_on_a_lifeline(processes, settings, connection, cfg, health="starting") as (proc, cut, _replica_id):
        cut()  # `up` died
        wait_for(
            lambda: proc.poll() is not None,
            EXIT_BOUND_S,
            lambda: f"the replica did not leave:\n{processes.log(cfg.name).read_text()[-3000:]}",
        )
        assert "is gone" in processes.log(cfg.name).read_text()
