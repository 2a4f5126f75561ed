"""Heartbeats as the scheduler reads them: a replica's news reaches it at once, silence is found by one range query,
and a farm whose replicas merely keep beating is read without a single heartbeat hash (control/heartbeats.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from streamserve.control.heartbeats import queue_beats, queue_removal
from streamserve.runtime.settings import Settings
from streamserve.scheduler.heartbeat_reader import HeartbeatReader
from streamserve.transport.connections import async_redis
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Heartbeat, now_ms
from streamserve.wire.states import ReplicaHealth
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

KEYS = Keys()
TIMEOUT_MS = 5_000
NAMES = ["alpha", "beta", "gamma"]


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = async_redis(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def beat(ts: int, health: ReplicaHealth = ReplicaHealth.READY, ongoing: int = 0) -> Heartbeat:
    return Heartbeat(ts_ms=ts, health=health, pid=42, host="h", ongoing=ongoing, version="v1")


async def write(redis: aioredis.Redis, name: str, beats: dict[str, Heartbeat], news: bool) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        queue_beats(pipe, KEYS, name, {rid: (b.ts_ms, b.encode()) for rid, b in beats.items()}, news)
        await pipe.execute()


async def hash_reads(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


async def test_beats_without_news_are_read_without_the_hash_and_news_is_read_at_once(redis: aioredis.Redis) -> None:
    now = now_ms()
    for name in NAMES:
        await write(redis, name, {f"{name}#r{i}": beat(now) for i in range(50)}, news=True)
    reader = HeartbeatReader(redis, KEYS, TIMEOUT_MS)
    first = await reader.read(NAMES, now)
    assert {name: len(first[name].said) for name in NAMES} == {name: 50 for name in NAMES}
    assert all(not b.silent for b in first.values())

    # A second later every replica beats again with nothing new to say (its in-flight count moved): no hash read.
    later = now + 1_000
    for name in NAMES:
        await write(redis, name, {f"{name}#r{i}": beat(later, ongoing=3) for i in range(50)}, news=False)
    reads = await hash_reads(redis)
    again = await reader.read(NAMES, later)
    assert await hash_reads(redis) == reads
    assert again["beta"].heard() == {f"beta#r{i}" for i in range(50)}

    # One replica of beta says it is unhealthy: only beta's hash is read again, and the news is there.
    await write(redis, "beta", {"beta#r7": beat(later + 10, ReplicaHealth.UNHEALTHY)}, news=True)
    news = await reader.read(NAMES, later + 20)
    assert await hash_reads(redis) == reads + 1
    assert news["beta"].said["beta#r7"].health is ReplicaHealth.UNHEALTHY
    assert news["alpha"].said["alpha#r7"].health is ReplicaHealth.READY


async def test_a_replica_that_stops_beating_is_silent_after_the_timeout_with_its_last_beat_time(
    redis: aioredis.Redis,
) -> None:
    now = now_ms()
    await write(redis, "alpha", {"alpha#quiet": beat(now), "alpha#busy": beat(now)}, news=True)
    reader = HeartbeatReader(redis, KEYS, TIMEOUT_MS)
    assert not (await reader.read(["alpha"], now))["alpha"].silent
    await write(redis, "alpha", {"alpha#busy": beat(now + 6_000)}, news=False)
    seen = (await reader.read(["alpha"], now + 6_000))["alpha"]
    assert seen.silent == {"alpha#quiet": now}
    assert seen.last_beat_ms("alpha#quiet") == now
    assert seen.last_beat_ms("alpha#busy") == now + 6_000  # heard within the timeout: counts as now
    assert seen.heard() == {"alpha#busy"}
    # After an outage that ended 2 s ago, nobody has been silent for longer than that.
    assert not (await reader.read(["alpha"], now + 6_000, silence_from_ms=now + 4_000))["alpha"].silent
    late = (await reader.read(["alpha"], now + 10_000, silence_from_ms=now + 4_000))["alpha"]
    assert late.silent == {"alpha#quiet": now + 4_000}  # silent since Redis came back, not since it last beat


async def test_a_removed_heartbeat_is_news_and_one_without_a_time_counts_by_its_own(redis: aioredis.Redis) -> None:
    now = now_ms()
    await write(redis, "alpha", {"alpha#a": beat(now), "alpha#b": beat(now)}, news=True)
    reader = HeartbeatReader(redis, KEYS, TIMEOUT_MS)
    assert set((await reader.read(["alpha"], now))["alpha"].said) == {"alpha#a", "alpha#b"}
    async with redis.pipeline(transaction=True) as pipe:
        queue_removal(pipe, KEYS, "alpha", ["alpha#b"])
        await pipe.execute()
    assert set((await reader.read(["alpha"], now))["alpha"].said) == {"alpha#a"}

    # Written by something that knows only the hash (an older worker): its own ts_ms says when it beat.
    await redis.hset(KEYS.heartbeats("alpha"), "alpha#old", beat(now).encode())
    await redis.incr(KEYS.heartbeat_news("alpha"))
    assert (await reader.read(["alpha"], now + 1_000))["alpha"].heard() == {"alpha#a", "alpha#old"}
    await write(redis, "alpha", {"alpha#a": beat(now + 6_000)}, news=False)
    assert (await reader.read(["alpha"], now + 6_000))["alpha"].silent == {"alpha#old": now}


async def test_a_replica_tells_news_once_and_its_exit_removes_its_heartbeat(
    start_replica: StartReplica, redis: aioredis.Redis, settings: Settings
) -> None:
    replica = await start_replica()
    rid = replica.replica_id.to_str()
    news_key, times_key = settings.keys.heartbeat_news("rec"), settings.keys.heartbeat_times("rec")
    told = await redis.get(news_key)
    first_time = await redis.zscore(times_key, rid)

    # It keeps beating (every 0.2 s here): its time moves on, the counter of news does not.
    async def beat_time_moved() -> bool:
        return await redis.zscore(times_key, rid) != first_time

    await wait_for_async(beat_time_moved, 5, "the replica's beat time never moved", interval_s=0.05)
    assert await redis.get(news_key) == told
    replica.request_stop()  # draining is news; leaving removes its heartbeat and its time

    async def heartbeat_gone() -> bool:
        return not await redis.hexists(settings.keys.heartbeats("rec"), rid)

    await wait_for_async(heartbeat_gone, 10, "the replica's heartbeat outlived it", interval_s=0.05)
    assert await redis.zscore(times_key, rid) is None
    assert int(await redis.get(news_key)) >= int(told) + 2
