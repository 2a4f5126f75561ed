"""A replica asked to stop while its code loads (a rollout, a scale-down or a delete overtaking a slow or hung
constructor) exits at once: it holds no request, and its constructor's thread cannot be stopped. It waited for the
constructor to end, or for graceful_shutdown_timeout_s (found by an outside tester: every rollback past a hung
version waited out the whole drain)."""

from __future__ import annotations

import signal

import redis

from streamserve.runtime.settings import Settings
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for
from tests.integration.conftest import deploy


async def test_a_replica_stopped_while_its_constructor_runs_exits_at_once(
    processes: Processes, settings: Settings
) -> None:
    await deploy(
        settings,
        name="slow",
        import_path="tests.deployments:SlowStart",
        init_kwargs={"seconds": 120},
        graceful_shutdown_timeout_s=60,
    )
    worker = processes.spawn("worker", "worker", "slow")
    with redis.Redis.from_url(settings.effective_redis_url) as store:
        beats = settings.keys.heartbeats("slow")
        wait_for(lambda: b'"starting"' in b"".join(store.hvals(beats)), 30, "the replica never began to load")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    assert "stop requested while its code loads: exiting" in processes.log("worker").read_text()
