"""A replica's control stream outlives a lapse: callers add to it with NOMKSTREAM, so one that expired while Redis
refused its renewals (a full disk for over a minute) must be made again, or every cancel goes nowhere."""

from __future__ import annotations

from streamserve.transport.connections import async_redis
from streamserve.wire.messages import Fields
from streamserve.workers.control_reader import ControlReader
from tests.harness.waiting import wait_for_async


async def test_a_control_stream_that_lapsed_is_made_again_and_read(redis_url: str) -> None:
    redis = async_redis(redis_url)
    key = "streamserve:test:control"
    got: list[Fields] = []
    reader = ControlReader(redis, key, {b"note": got.append}, "r1")
    await reader.start()
    try:

        async def made() -> bool:
            return bool(await redis.exists(key))

        await wait_for_async(made, 10, "the control stream was not made")
        await redis.delete(key)  # what its expiry does once renewals were refused for CONTROL_TTL_MS
        await wait_for_async(made, 10, "the control stream that lapsed was not made again")
        await redis.xadd(key, {"kind": "note", "n": "1"}, nomkstream=True)  # as callers add

        async def read() -> bool:
            return [fields.get(b"n") for fields in got] == [b"1"]

        await wait_for_async(read, 10, "the entry added after the lapse was not read")
    finally:
        await reader.aclose()
        await redis.aclose()
