"""A replica that has drained exits, even when a step of its exit hangs (CI once saw one hang after its drain)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from streamserve.connection import async_redis
from streamserve.ids import ReplicaID
from streamserve.settings import Settings
from streamserve.workers import replica as replica_module
from streamserve.workers.replica import Replica
from tests.integration.conftest import deploy


async def test_a_hanging_exit_step_is_cut_short_and_named(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "WIND_DOWN_STEP_S", 0.5)
    caplog.set_level(logging.WARNING, logger=replica_module.__name__)
    cfg = await deploy(settings)
    redis = async_redis(settings.effective_redis_url)
    replica = Replica(settings, redis, ReplicaID.new(cfg.name))
    task = asyncio.create_task(replica.run())
    try:
        beats = settings.keys.heartbeats(cfg.name)
        for _ in range(200):
            raw = await redis.hget(beats, replica.replica_id.to_str())
            if raw is not None and b'"ready"' in raw:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the replica did not become ready")

        async def never() -> None:
            await asyncio.Event().wait()

        pipeliner = replica._pipeliner
        closed = pipeliner.aclose
        monkeypatch.setattr(pipeliner, "aclose", never)
        replica.request_stop()
        assert await asyncio.wait_for(task, timeout=10) == 0
        assert "the replies did not finish within 0.5s; exiting anyway" in caplog.text
        # The steps after it still ran: its heartbeat is gone.
        assert await redis.hget(beats, replica.replica_id.to_str()) is None
        await closed()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()
