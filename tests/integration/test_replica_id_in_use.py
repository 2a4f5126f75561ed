"""A worker given the id of a live replica (`worker --replica-id`, with an id `status` shows) must not serve under
it: when either stopped, the heartbeat it removed had the scheduler write off and kill the other."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import now_ms
from streamserve.workers.replica import Replica
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy


async def test_a_worker_given_a_live_replicas_id_exits_and_leaves_it_serving(
    settings: Settings, start_replica: StartReplica, aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    live = await start_replica()
    rid = live.replica_id.to_str()
    times = settings.keys.heartbeat_times("rec")
    redis = async_redis(settings.effective_redis_url)
    try:
        impostor = Replica(settings, redis, live.replica_id)
        assert await asyncio.wait_for(impostor.run(), 10) == 1
    finally:
        await redis.aclose()
    assert f"replica id {rid} is in use: a live replica heartbeats under it" in caplog.text
    beat = await aredis.zscore(times, rid)
    assert beat is not None, "the live replica's heartbeat was removed"
    await wait_for_async(lambda: _moved(aredis, times, rid, beat), 5, "the live replica stopped beating")


async def test_a_worker_started_again_under_its_dead_process_id_serves(
    settings: Settings, aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A supervisor starts a worker again with the --replica-id it had: its last beat, still fresh, moves no more."""
    await deploy(settings)
    rid = "rec#0123456789abcdef"
    await aredis.zadd(settings.keys.heartbeat_times("rec"), {rid: now_ms() - 100})
    redis = async_redis(settings.effective_redis_url)
    again = Replica(settings, redis, ReplicaID.from_str(rid))
    task = asyncio.create_task(again.run())
    try:
        beats = settings.keys.heartbeats("rec")

        async def ready() -> bool:
            raw = await aredis.hget(beats, rid)
            return raw is not None and b'"ready"' in raw

        await wait_for_async(ready, 10, "the worker did not serve under its own dead process's id")
    finally:
        again.request_stop()
        await asyncio.wait_for(task, 10)
        await redis.aclose()
    assert "is in use" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def _moved(aredis: aioredis.Redis, times: str, rid: str, beat: float) -> bool:
    now = await aredis.zscore(times, rid)
    return now is not None and now > beat
