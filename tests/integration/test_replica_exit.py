"""A replica that has drained exits, even when a step of its exit hangs (CI once saw one hang after its drain)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.ids import ReplicaID
from streamserve.workers import replica as replica_module
from streamserve.workers.replica import Replica
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import deploy


@contextlib.asynccontextmanager
async def serving_replica(settings: Settings) -> AsyncIterator[tuple[Replica, asyncio.Task[int], aioredis.Redis]]:
    """A replica of the deployment ``rec``, run in this process until it is ready; its task, and a client."""
    cfg = await deploy(settings)
    redis = async_redis(settings.effective_redis_url)
    replica = Replica(settings, redis, ReplicaID.new(cfg.name))
    task = asyncio.create_task(replica.run())
    try:
        beats, rid = settings.keys.heartbeats(cfg.name), replica.replica_id.to_str()

        async def ready() -> bool:
            raw = await redis.hget(beats, rid)
            return raw is not None and b'"ready"' in raw

        await wait_for_async(ready, 10, "the replica did not become ready", interval_s=0.05)
        yield replica, task, redis
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()


async def test_a_hanging_exit_step_is_cut_short_and_named(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "WIND_DOWN_STEP_S", 0.5)
    caplog.set_level(logging.WARNING, logger=replica_module.__name__)
    async with serving_replica(settings) as (replica, task, redis):
        beats = settings.keys.heartbeats(replica.replica_id.deployment)

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


async def test_a_heartbeat_that_loses_its_cancellation_still_ends(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py can swallow a cancellation that lands in a write: the heartbeat loop then went on beating, and the
    replica waited for it forever. It ends on the replica's own flag too, at once."""
    caplog.set_level(logging.WARNING, logger=replica_module.__name__)
    async with serving_replica(settings) as (replica, task, _redis):
        swallowed: list[bool] = []
        beating: list[bool] = []

        async def beat_that_swallows_its_cancellation() -> None:
            beating.append(True)
            try:
                await asyncio.sleep(0.5)  # a write in progress: most of the loop's time is spent here
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # the first one only, as the library did

        monkeypatch.setattr(replica._heartbeat, "_beat", beat_that_swallows_its_cancellation)
        await wait_for_async(lambda: bool(beating), 5, "the loop never began a beat")  # it is inside one now
        replica.request_stop()
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(task, timeout=30) == 0
        assert asyncio.get_running_loop().time() - started < replica_module.WIND_DOWN_STEP_S / 2
        assert "did not finish" not in caplog.text
