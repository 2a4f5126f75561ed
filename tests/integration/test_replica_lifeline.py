"""A replica whose `streamserve up` died (its lifeline cut, runtime/lifeline.py) leaves by itself, as operations.md
says: it drains for FARM_GONE_DRAIN_S at most, whatever it runs. Real `streamserve worker` processes, given a
lifeline the test holds."""

from __future__ import annotations

import contextlib
import functools
import subprocess
from collections.abc import Callable, Iterator

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


@contextlib.contextmanager
def replica_on_a_lifeline(
    processes: Processes, settings: Settings, connection: redis.Redis, cfg: DeploymentConfig
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], None], ReplicaID]]:
    """``cfg`` deployed and one `streamserve worker` of it started as the scheduler starts one (a session of its own,
    `up`'s lifeline handed down), ready: the process, what cuts its lifeline (`up` died), its id."""
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
            return raw is not None and Heartbeat.decode(raw).health == "ready"

        wait_for(ready, 30, lambda: f"the replica did not become ready:\n{processes.log(cfg.name).read_text()}")
        yield proc, cut, replica_id
    finally:
        cut()


def test_a_replica_running_a_redelivered_request_leaves_within_its_bounds_when_up_dies(
    processes: Processes, settings: Settings, connection: redis.Redis
) -> None:
    """A request a dead replica held is run alone (serving._run_alone), and the read loop used to wait for it to be
    finished: the drain, and its FARM_GONE_DRAIN_S, began only once it was, never when its reply could not be sent
    (Redis gone with `up`). Here its handler sleeps 60 s; the replica must not wait for it."""
    cfg = DeploymentConfig(name="redelivered", import_path="tests.deployments:crash_on")
    with replica_on_a_lifeline(processes, settings, connection, cfg) as (proc, cut, replica_id):
        # What the scheduler queues again for a replica that died holding it: its entry with an attempt counted.
        request = Request("again", "", now_ms() + 120_000, b'{"sleep": 60}', attempts=1)
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
