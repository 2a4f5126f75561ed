"""The bounds the docs promise on the streams besides the request queue: dead letters and reply streams.

docs/architecture.md, "The Redis layout": ``streamserve:{NAME}:dead`` is a stream "capped at ~10,000", and
``streamserve:replies:CALLER`` is a stream that "expires". "How a request travels": a replica adds
its reply "with NOMKSTREAM, so a dead caller's stream is never recreated", and each caller "refreshes
the stream's expiry and trims what it has read".
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest
import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.transport.streams import Requeuer, ensure_group
from streamserve.wire.errors import UnavailableError
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Request, now_ms
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

# The figure the docs state; MAXLEN ~ may keep up to one radix-tree node (100 entries by default) more.
README_DEAD_LETTER_CAP = 10_000
MAXLEN_SLACK = 200
README_REPLY_TTL_S = 60
# Redis's default stream-node-max-entries: approximate trimming removes whole nodes of this many entries.
STREAM_NODE_MAX_ENTRIES = 100
"""client.py: a caller's reply stream "expires this long after its caller stops refreshing it (it died)"."""


# One stream entry as redis-py returns it (bytes replies).
Entry = tuple[bytes, dict[bytes, bytes]]


def request_fields(n: int, reply_to: str = "") -> dict[FieldT, EncodableT]:
    """The fields a caller queues for request ``n`` (messages.Request, the wire format replicas read)."""
    return dict(Request(f"req-{n}", reply_to, now_ms() + 60_000, b'{"n": %d}' % n).encode())


async def entries(redis: aioredis.Redis, stream: str) -> list[Entry]:
    return cast(list[Entry], await redis.xrange(stream))


# -- the dead-letter stream -------------------------------------------------------------------


async def test_the_dead_letter_stream_stays_near_its_cap(aredis: aioredis.Redis, settings: Settings) -> None:
    """10,500 requests that each use up their one delivery all go to the dead-letter stream, which keeps ~10,000."""
    total, batch = 10_500, 500
    stream, dead = settings.keys.requests("poison"), settings.keys.dead_letters("poison")
    await ensure_group(aredis, stream)
    async with aredis.pipeline(transaction=False) as pipe:
        for n in range(total):
            pipe.xadd(stream, request_fields(n))
        await pipe.execute()
    # A replica reads them (they are now pending in the group, as on a replica that then died).
    [(_stream, read)] = cast(
        list[tuple[bytes, list[Entry]]],
        await aredis.xreadgroup(CONSUMER_GROUP, "doomed-replica", {stream: ">"}, count=total),
    )
    ids = [entry_id for entry_id, _fields in read]
    assert len(ids) == total

    requeuer = Requeuer(aredis, settings.keys)
    dead_lettered = 0
    for start in range(0, total, batch):
        letters = await requeuer.requeue(
            "poison", ids[start : start + batch], charge=True, max_delivery_attempts=1, reason="it crashed"
        )
        dead_lettered += len(letters)

    assert dead_lettered == total  # every one of them reached max_delivery_attempts
    assert await aredis.xlen(stream) == 0  # nothing went back to the queue
    length = await aredis.xlen(dead)
    assert 9_000 < length <= README_DEAD_LETTER_CAP + MAXLEN_SLACK, f"dead-letter stream holds {length} entries"
    # The trimming drops the oldest: the newest dead letter is kept, with the request's fields, attempts and reason.
    [(_entry_id, newest)] = cast(list[Entry], await aredis.xrevrange(dead, count=1))
    assert newest[b"id"] == f"req-{total - 1}".encode()
    assert newest[b"attempts"] == b"1" and newest[b"reason"] == b"it crashed"


# -- reply streams ------------------------------------------------------------------------------


async def test_a_reply_to_a_reply_stream_that_is_gone_does_not_recreate_it(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    """A caller died and its reply stream expired; the replica still runs its request but writes no reply stream."""
    await start_replica()
    requests = settings.keys.requests("rec")
    gone, alive = settings.keys.reply_stream("dead-caller"), settings.keys.reply_stream("live-caller")
    await aredis.xadd(gone, {"hello": "dead-caller"})
    await aredis.pexpire(gone, 1)

    async def expired() -> bool:
        return not await aredis.exists(gone)

    await wait_for_async(expired, 5, "the reply stream never expired")
    await aredis.xadd(alive, {"hello": "live-caller"})
    await aredis.xadd(requests, request_fields(1, reply_to=gone))
    await aredis.xadd(requests, request_fields(2, reply_to=alive))

    async def both_answered() -> bool:
        # The replica XACKs and XDELs an entry in the round trip that sends its reply.
        return bool(await aredis.xlen(requests) == 0 and await aredis.xlen(alive) == 2)

    await wait_for_async(both_answered, 10, "the replica did not answer both requests")
    assert await aredis.exists(gone) == 0
    replies = [fields for _entry_id, fields in await entries(aredis, alive)][1:]  # after the caller's hello
    assert [(reply[b"id"], reply[b"status"]) for reply in replies] == [(b"req-2", b"ok")]


async def test_a_callers_reply_stream_expires_and_a_closed_caller_leaves_none(
    gate: None, start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    """The reply stream carries an expiry (so a caller that dies leaves nothing for long); closing drops it."""
    await start_replica(import_path="tests.deployments:gate")
    client = AsyncClient(settings=settings)
    await client.start()
    reply_stream = settings.keys.reply_stream(client.caller_id)
    try:
        ttl_ms = await aredis.pttl(reply_stream)
        assert 0 < ttl_ms <= README_REPLY_TTL_S * 1000, f"reply stream PTTL {ttl_ms}"
        call = asyncio.ensure_future(client.call("rec", "late", timeout=30))

        async def held_by_the_replica() -> bool:
            return bool((await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP))["pending"] == 1)

        await wait_for_async(held_by_the_replica, 10, "the replica never took the request")
    finally:
        await client.aclose()
    with pytest.raises(UnavailableError):
        await call
    assert await aredis.exists(reply_stream) == 0

    deployments.GATE.set()  # the handler finishes after its caller went away

    async def answered() -> bool:
        return bool(await aredis.xlen(settings.keys.requests("rec")) == 0)

    await wait_for_async(answered, 10, "the replica never finished the request")
    assert await aredis.exists(reply_stream) == 0


async def test_a_live_caller_refreshes_its_reply_streams_expiry_and_trims_what_it_read(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    """Takes about 20 s: the caller's upkeep runs every third of the expiry (the period is not a setting).

    The trim is approximate (``XTRIM MINID ~``): Redis drops only whole radix-tree nodes of read replies, 100
    entries each by default, so the stream ends up with at most one node's worth of them.
    """
    await start_replica(max_ongoing_requests=32)
    client = AsyncClient(settings=settings)
    started = time.monotonic()
    await client.start()
    reply_stream = settings.keys.reply_stream(client.caller_id)
    replies = 300
    trims_before = await xtrim_calls(aredis)
    try:
        results = await asyncio.gather(*(client.call("rec", n, timeout=20) for n in range(replies)))
        assert [result["body"] for result in results] == list(range(replies))
        # (Trimmed about once a second: on a slow machine the first trim may come while the calls still run.)
        seen: dict[str, int] = {}

        async def refreshed_and_trimmed() -> bool:
            # Set once at start, the expiry would fall at started + 60 s; refreshed, it lies further out.
            unrefreshed_ms = (started + README_REPLY_TTL_S - time.monotonic()) * 1000
            seen.update(pttl=await aredis.pttl(reply_stream), xlen=await aredis.xlen(reply_stream))
            return seen["pttl"] > unrefreshed_ms + 5_000 and seen["xlen"] <= STREAM_NODE_MAX_ENTRIES

        await wait_for_async(refreshed_and_trimmed, 40, lambda: f"expiry not refreshed, or stream not trimmed: {seen}")
        assert await xtrim_calls(aredis) > trims_before  # the caller trimmed what it read
        assert 0 < await aredis.pttl(reply_stream) <= README_REPLY_TTL_S * 1000
        assert (await client.call("rec", "after", timeout=10))["body"] == "after"  # the trim kept it working
    finally:
        await client.aclose()


# The load below: how long, and the calls of one step; how far back the replies a reply stream holds may reach: its
# trim interval (a second), and a second for a busy host.
LOAD_S = 4.0
BATCH = 100
TRIM_WINDOW_S = 2.0


async def test_a_callers_reply_stream_keeps_about_a_second_of_read_replies_under_load(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    """Read replies are trimmed about once a second, by one XTRIM riding with a read, not a command per reply."""
    await start_replica(max_ongoing_requests=64)
    stream = settings.keys.reply_stream(client.caller_id)
    trims_before = await xtrim_calls(aredis)
    loop = asyncio.get_running_loop()
    started = loop.time()
    answered = 0
    seen: list[tuple[float, int, int, int]] = []  # (seconds, answered, held, XTRIMs so far), after each batch
    while loop.time() - started < LOAD_S:
        answered += len(await asyncio.gather(*(client.call("rec", i) for i in range(BATCH))))
        held = await aredis.xlen(stream)
        seen.append((loop.time() - started, answered, held, await xtrim_calls(aredis) - trims_before))
    seconds = loop.time() - started
    assert answered > 1000
    # The stream holds the replies since the last trim: about a second's, and those read since (a trim rides with
    # the next read once it is due, so it may wait out a batch). So at every look it holds at most what was answered
    # in the last TRIM_WINDOW_S, and a batch: never the whole run's. Measured against the recent answers, not the
    # run's total: on a host busy with farms the rate changes within the run (a CI run's 3 s of calls once took 6.4 s).
    for at, answered_then, held, _trims in seen:
        if at > TRIM_WINDOW_S:
            recent = answered_then - max((n for t, n, *_ in seen if t <= at - TRIM_WINDOW_S), default=0)
            assert held <= recent + BATCH, ("held", held, "answered in the last 2 s", recent, "run", seen)

    async def trimmed() -> bool:
        return bool(await aredis.xlen(stream) <= 1)

    await wait_for_async(trimmed, 3, "the replies read were not trimmed once the load stopped")
    assert await xtrim_calls(aredis) - trims_before <= seconds + 4


async def xtrim_calls(aredis: aioredis.Redis) -> int:
    stats = await aredis.info("commandstats")
    return int(stats.get("cmdstat_xtrim", {}).get("calls", 0))
