"""The scripts that priorities add or change, on a real redis-server: TAKE (a replica's read in priority order),
and CANCEL with REQUEUE naming an entry of a priority stream by its ref, though another stream has its id too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from streamserve.client.cancels import Canceller
from streamserve.runtime.settings import Settings
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import Requeuer, ensure_groups
from streamserve.wire import scripts
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Request, now_ms
from streamserve.wire.priorities import Priority, priority_lane

DEPLOYMENT = "rec"
REPLICA = "rec#r1"


@pytest.fixture
async def streams(aredis: aioredis.Redis, settings: Settings) -> dict[Priority, str]:
    await ensure_groups(aredis, settings.keys, DEPLOYMENT)
    return settings.keys.request_streams(DEPLOYMENT)


async def add(redis: aioredis.Redis, stream: str, label: str, entry_id: str = "*", priority: str = "normal") -> str:
    request = Request(label, "", now_ms() + 60_000, b"1", priority=Priority(priority))
    return cast(bytes, await redis.xadd(stream, dict(request.encode()), id=entry_id)).decode()


async def take(redis: aioredis.Redis, order: list[str], count: int) -> list[tuple[str, str]]:
    """TAKE's answer as (stream, request id) pairs, in the order it read them."""
    args = (CONSUMER_GROUP, REPLICA, count)
    raw = cast(list[Any], await redis.eval(scripts.TAKE, len(order), *order, *args))  # type: ignore[misc]
    return [
        (stream.decode(), dict(zip(f[::2], f[1::2], strict=True))[b"id"].decode())
        for stream, entries in raw
        for _entry_id, f in entries
    ]


async def test_take_reads_each_stream_to_its_end_in_the_order_given_up_to_the_count(
    aredis: aioredis.Redis, streams: dict[Priority, str]
) -> None:
    high, normal, low = streams[Priority.HIGH], streams[Priority.NORMAL], streams[Priority.LOW]
    for i in range(2):
        await add(aredis, low, f"low-{i}")
        await add(aredis, normal, f"normal-{i}")
    await add(aredis, high, "high-0")
    assert await take(aredis, [high, normal, low], 2) == [(high, "high-0"), (normal, "normal-0")]
    assert await take(aredis, [low, high, normal], 3) == [(low, "low-0"), (low, "low-1"), (normal, "normal-1")]
    assert await take(aredis, [high, normal, low], 5) == []  # nothing left: the replica blocks in XREADGROUP instead
    # What it took is pending under the replica, as an XREADGROUP's read would be.
    pending = [await aredis.xpending(stream, CONSUMER_GROUP) for stream in (high, normal, low)]
    assert [p["pending"] for p in pending] == [1, 2, 2]


async def test_take_on_a_stream_without_its_group_fails_so_the_replica_makes_it(
    aredis: aioredis.Redis, streams: dict[Priority, str]
) -> None:
    await aredis.delete(streams[Priority.LOW])
    await add(aredis, streams[Priority.HIGH], "high-0")
    with pytest.raises(ResponseError, match="NOGROUP"):
        await take(aredis, [streams[Priority.LOW], streams[Priority.HIGH]], 1)


@pytest.fixture
async def canceller(aredis: aioredis.Redis, settings: Settings) -> AsyncIterator[Canceller]:
    pipeliner = Pipeliner(aredis)
    yield Canceller(aredis, pipeliner, settings.keys)


async def test_a_cancelled_high_entry_is_dropped_by_requeue_and_a_normal_one_with_its_id_is_not(
    aredis: aioredis.Redis, settings: Settings, streams: dict[Priority, str], canceller: Canceller
) -> None:
    high, normal = streams[Priority.HIGH], streams[Priority.NORMAL]
    same = "1700000000000-0"  # one id in two streams
    await add(aredis, high, "h", same, "high")
    await add(aredis, normal, "n", same)
    for stream in (high, normal):
        await aredis.xreadgroup(CONSUMER_GROUP, REPLICA, {stream: ">"})
    request = Request("h", "", now_ms() + 60_000, b"1", priority=Priority.HIGH)
    assert await canceller.cancel(DEPLOYMENT, same, "h", request) == "running"
    assert await aredis.zrange(settings.keys.cancelled(DEPLOYMENT), 0, -1) == [b"high/" + same.encode()]
    # The replica dies holding both: the cancelled one is dropped, the other queued again.
    requeuer = Requeuer(aredis, settings.keys)
    for priority in (Priority.HIGH, Priority.NORMAL):
        await requeuer.requeue(DEPLOYMENT, [same], charge=True, max_delivery_attempts=3, lane=priority_lane(priority))
    assert await aredis.xlen(high) == 0
    assert [fields[b"id"] for _id, fields in await aredis.xrange(normal)] == [b"n"]
