"""Cache hits answered from a caller's own copies are added to the deployment's metrics in Redis (HitCounts), and
none is lost to a refused flush."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from streamserve.client import hot_entries
from streamserve.client.hot_entries import HitCounts
from streamserve.metrics.definitions import CACHE_REQUESTS
from streamserve.transport.pipelining import Pipeliner
from streamserve.wire.keys import Keys
from tests.harness.waiting import wait_for_async

KEYS = Keys()
FIELD = CACHE_REQUESTS.field("hit")


async def hits(aredis: aioredis.Redis, deployment: str) -> int:
    return int(await aredis.hget(KEYS.metrics(deployment), FIELD) or 0)


async def test_hits_are_added_within_the_flush_interval_and_a_refused_flush_keeps_them(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hot_entries, "HIT_COUNT_FLUSH_S", 0.05)
    pipeliner = Pipeliner(aredis)
    counts = HitCounts(pipeliner, KEYS, FIELD)
    try:
        await aredis.set(KEYS.metrics("b"), "not a hash")  # HINCRBY on it is refused (WRONGTYPE)
        for _ in range(3):
            counts.add("a")
        counts.add("b")
        await wait_for_async(lambda: hits(aredis, "a"), 5.0, "the hits of a were never added")
        assert await hits(aredis, "a") == 3
        await aredis.delete(KEYS.metrics("b"))  # b's flush was refused: its hit is sent again with the next
        counts.add("b")
        await wait_for_async(lambda: hits(aredis, "b"), 5.0, "the hits of b were never added")
        assert (await hits(aredis, "a"), await hits(aredis, "b")) == (3, 2)
        counts.add("a")
        await aredis.set(KEYS.metrics("b"), "not a hash")
        counts.add("b")
        counts.close()  # what is left goes at once; b's refused hit is not tried again after
        await pipeliner.aclose()
        assert await hits(aredis, "a") == 4
        assert counts._timer is None
    finally:
        await pipeliner.aclose()
