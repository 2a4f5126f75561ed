"""The CANCEL script through the caller's ``Canceller`` on a real redis-server, wherever the request is: still queued
(deleted, counted, never read), held by a replica (marked, and that replica told on its control stream), finished
(nothing); and REQUEUE (the reclaimer, a hand-back) dropping an entry marked cancelled instead of queueing it again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest
import redis.asyncio as aioredis

from streamserve.client.cancels import CANCEL_MARK_MARGIN_MS, Canceller
from streamserve.metrics.definitions import CANCELLED, QUEUED_STAGE
from streamserve.runtime.settings import Settings
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import Requeuer, ensure_group
from streamserve.wire import scripts
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import CancelRequest, Request, now_ms

DEPLOYMENT = "rec"
REPLICA = "rec#r1"
Entry = tuple[bytes, dict[bytes, bytes]]


class Queue:
    """One deployment's request stream, its cancelled marks, its metrics hash and one replica's control stream."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, canceller: Canceller) -> None:
        keys = settings.keys
        self.redis = redis
        self.canceller = canceller
        self.requeuer = Requeuer(redis, keys)
        self.stream = keys.requests(DEPLOYMENT)
        self.marks = keys.cancelled(DEPLOYMENT)
        self.metrics = keys.metrics(DEPLOYMENT)
        self.dead = keys.dead_letters(DEPLOYMENT)
        self.control = keys.replica_control(DEPLOYMENT, REPLICA)

    async def add(self, request_id: str) -> str:
        return (await self.add_request(request_id))[0]

    async def add_request(self, request_id: str, timeout_ms: int = 60_000) -> tuple[str, Request]:
        request = Request(request_id, "streamserve:replies:caller1", now_ms() + timeout_ms, b'{"x":1}')
        return cast(bytes, await self.redis.xadd(self.stream, dict(request.encode()))).decode(), request

    async def read(self, count: int = 100) -> list[str]:
        """What a replica's XREADGROUP takes: the entries become pending under REPLICA."""
        read = cast(
            list[tuple[bytes, list[Entry]]],
            await self.redis.xreadgroup(CONSUMER_GROUP, REPLICA, {self.stream: ">"}, count=count),
        )
        return [entry_id.decode() for _stream, entries in read for entry_id, _fields in entries]

    async def finish(self, entry_id: str) -> None:
        """What a replica does once it has answered: acknowledge and delete, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xack(self.stream, CONSUMER_GROUP, entry_id)
            pipe.xdel(self.stream, entry_id)
            await pipe.execute()

    async def ids(self) -> list[bytes]:
        return [fields[b"id"] for _, fields in cast(list[Entry], await self.redis.xrange(self.stream))]

    async def pending(self) -> int:
        return int((await self.redis.xpending(self.stream, CONSUMER_GROUP))["pending"])

    async def marked(self) -> list[bytes]:
        return cast(list[bytes], await self.redis.zrange(self.marks, 0, -1))

    async def cancelled_while_queued(self) -> int:
        return int(await self.redis.hget(self.metrics, CANCELLED.field(QUEUED_STAGE)) or 0)

    async def control_messages(self) -> list[CancelRequest]:
        entries = cast(list[Entry], await self.redis.xrange(self.control))
        return [CancelRequest.decode(fields) for _, fields in entries]


@pytest.fixture
async def queue(aredis: aioredis.Redis, settings: Settings) -> AsyncIterator[Queue]:
    pipeliner = Pipeliner(aredis)
    q = Queue(aredis, settings, Canceller(aredis, pipeliner, settings.keys))
    await ensure_group(aredis, q.stream)
    # The replica's control stream exists while it runs (a cancel is added with NOMKSTREAM).
    await aredis.xgroup_create(q.control, "readers", id="$", mkstream=True)
    try:
        yield q
    finally:
        await pipeliner.aclose()


async def test_a_queued_request_is_deleted_counted_and_never_read(queue: Queue) -> None:
    cancelled = await queue.add("cancelled")
    await queue.add("kept")

    assert await queue.canceller.cancel(DEPLOYMENT, cancelled, "cancelled") == "queued"

    assert await queue.ids() == [b"kept"]
    assert await queue.cancelled_while_queued() == 1
    assert await queue.marked() == []  # nothing to drop later: it is gone
    assert await queue.control_messages() == []  # no replica to tell
    read = await queue.read()
    assert len(read) == 1 and read[0] != cancelled  # a replica reading later gets only the other one


async def test_a_held_request_is_marked_and_its_replica_told(queue: Queue) -> None:
    held = await queue.add("held")
    await queue.read()

    assert await queue.canceller.cancel(DEPLOYMENT, held, "held") == "running"

    assert await queue.marked() == [held.encode()]
    assert await queue.control_messages() == [CancelRequest(held, "held")]
    assert await queue.ids() == [b"held"] and await queue.pending() == 1  # the replica finishes it, as ever
    assert await queue.cancelled_while_queued() == 0  # its replica counts it, as running


async def test_the_script_names_the_replica_holding_the_request(queue: Queue) -> None:
    """The script itself, as ``Canceller`` runs it: "running" and the consumer (replica id) that holds the entry."""
    held = await queue.add("held")
    await queue.read()

    where = await queue.redis.eval(  # type: ignore[misc]
        scripts.CANCEL,
        3,
        queue.stream,
        queue.marks,
        queue.metrics,
        CONSUMER_GROUP,
        held,
        now_ms(),
        now_ms() + 60_000,
        "f",
        held,
    )
    assert where == [b"running", REPLICA.encode()]


async def test_a_mark_is_kept_past_its_requests_deadline_only_and_the_set_lapses_with_the_last(queue: Queue) -> None:
    """A replica never starts a request past its deadline, so its mark is of no use after it: marks went on for a
    day (24 h of every abandoned stream, with no expiry on the set)."""
    soon, soon_request = await queue.add_request("soon", timeout_ms=1)
    later, later_request = await queue.add_request("later", timeout_ms=30_000)
    await queue.read()
    assert await queue.canceller.cancel(DEPLOYMENT, soon, "soon", soon_request) == "running"
    assert await queue.redis.zscore(queue.marks, soon) == soon_request.deadline_ms + CANCEL_MARK_MARGIN_MS
    assert await queue.canceller.cancel(DEPLOYMENT, later, "later", later_request) == "running"
    until = later_request.deadline_ms + CANCEL_MARK_MARGIN_MS
    lapses_at = now_ms() + await queue.redis.pttl(queue.marks)
    assert abs(lapses_at - until) <= 50  # it lapses with its last mark (Redis's ms against ours: a little apart)
    # A cancel after the first mark's end trims it.
    await queue.redis.zadd(queue.marks, {soon: now_ms() - 1})
    third, third_request = await queue.add_request("third")
    await queue.read()
    assert await queue.canceller.cancel(DEPLOYMENT, third, "third", third_request) == "running"
    assert set(await queue.marked()) == {later.encode(), third.encode()}


async def test_a_cancel_after_its_marks_end_still_tells_the_replica(queue: Queue) -> None:
    """A cancel sent past the request's deadline and its margin (or from a host whose clock is ahead): its mark lapses
    at once, and the set with it; the script failed on the empty set, and the replica was never told."""
    late, late_request = await queue.add_request("late", timeout_ms=-2 * CANCEL_MARK_MARGIN_MS)
    await queue.read()
    assert await queue.canceller.cancel(DEPLOYMENT, late, "late", late_request) == "running"
    assert await queue.marked() == [] and await queue.redis.exists(queue.marks) == 0
    assert await queue.control_messages() == [CancelRequest(late, "late")]


async def test_a_finished_request_is_left_alone(queue: Queue) -> None:
    done = await queue.add("done")
    await queue.add("next")
    await queue.read(count=1)
    await queue.finish(done)

    assert await queue.canceller.cancel(DEPLOYMENT, done, "done") == "finished"

    assert await queue.ids() == [b"next"]  # nothing else touched
    assert await queue.marked() == []
    assert await queue.control_messages() == []
    assert await queue.cancelled_while_queued() == 0


@pytest.mark.parametrize("charge", [True, False], ids=["reclaimed", "handed-back"])
async def test_requeue_drops_an_entry_cancelled_while_held(queue: Queue, charge: bool) -> None:
    cancelled = await queue.add("cancelled")
    kept = await queue.add("kept")
    await queue.read()
    assert await queue.canceller.cancel(DEPLOYMENT, cancelled, "cancelled") == "running"

    dead = await queue.requeuer.requeue(DEPLOYMENT, [cancelled, kept], charge=charge, max_delivery_attempts=3)

    assert await queue.ids() == [b"kept"]  # only the other one is queued again
    assert dead == [] and await queue.redis.xlen(queue.dead) == 0  # and the cancelled one is not dead-lettered
    assert await queue.pending() == 0  # both acknowledged ...
    assert await queue.redis.xrange(queue.stream, cancelled, cancelled) == []  # ... and deleted
    assert await queue.marked() == []  # the mark is used up
