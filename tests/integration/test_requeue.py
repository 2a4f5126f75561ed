"""The REQUEUE script through ``Requeuer``, on a real redis-server: what a dead or handing-back replica leaves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.scheduler.reclaim import Reclaimer
from streamserve.transport.streams import DeadLetter, Requeuer, ensure_group
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms
from streamserve.wire.tenants import DEFAULT_TENANT

REASON = "replica rec#dead died holding it"
Entry = tuple[bytes, dict[bytes, bytes]]


class Queue:
    """One deployment's request and dead-letter streams, and a consumer that takes entries off the queue."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self.redis = redis
        self.stream = settings.keys.requests("rec")
        self.dead = settings.keys.dead_letters("rec")
        self.requeuer = Requeuer(redis, settings.keys)

    async def add(self, request_id: str, attempts: int = 0, tenant: str = DEFAULT_TENANT, held: str = "") -> bytes:
        request = Request(request_id, "streamserve:replies:caller1", now_ms() + 60_000, b'{"x":1}', "m", attempts)
        request.tenant, request.held = tenant, held
        return cast(bytes, await self.redis.xadd(self.stream, dict(request.encode())))

    async def take(self, count: int = 100) -> list[bytes]:
        """Read (as a replica does) whatever is queued: the entries become pending in the group."""
        read = cast(
            list[tuple[bytes, list[Entry]]],
            await self.redis.xreadgroup(CONSUMER_GROUP, "rec#r1", {self.stream: ">"}, count=count),
        )
        return [entry_id for _stream, entries in read for entry_id, _fields in entries]

    async def entries(self) -> list[Entry]:
        return cast(list[Entry], await self.redis.xrange(self.stream))

    async def dead_letters(self) -> list[Entry]:
        return cast(list[Entry], await self.redis.xrange(self.dead))

    async def pending(self) -> int:
        return int((await self.redis.xpending(self.stream, CONSUMER_GROUP))["pending"])

    async def requeue(self, entry_ids: Sequence[bytes], *, charge: bool, max_attempts: int = 3) -> list[DeadLetter]:
        return await self.requeuer.requeue(
            "rec", entry_ids, charge=charge, max_delivery_attempts=max_attempts, reason=REASON
        )


@pytest.fixture
async def queue(aredis: aioredis.Redis, settings: Settings) -> Queue:
    q = Queue(aredis, settings)
    await ensure_group(aredis, q.stream)
    return q


def without_attempts(fields: dict[bytes, bytes]) -> dict[bytes, bytes]:
    return {k: v for k, v in fields.items() if k != b"attempts"}


async def test_a_charged_requeue_counts_one_attempt_and_moves_the_entry_to_the_tail(queue: Queue) -> None:
    first = await queue.add("req-1")
    await queue.add("req-2")
    [(_, original), _] = await queue.entries()
    await queue.take(count=1)  # only req-1 is pending; req-2 still waits

    assert await queue.requeue([first], charge=True) == []

    entries = await queue.entries()
    assert [fields[b"id"] for _, fields in entries] == [b"req-2", b"req-1"]  # a new entry, behind req-2
    new_id, fields = entries[1]
    assert new_id != first and new_id > entries[0][0]
    assert fields[b"attempts"] == b"1"
    assert without_attempts(fields) == original  # every other field as it was
    assert await queue.pending() == 0  # the old one is acknowledged ...
    assert await queue.redis.xrange(queue.stream, first, first) == []  # ... and deleted
    assert await queue.dead_letters() == []
    assert Request.decode(fields).attempts == 1


async def test_an_uncharged_requeue_counts_nothing(queue: Queue) -> None:
    await queue.add("fresh")
    await queue.add("again", attempts=2)
    taken = await queue.take()

    assert await queue.requeue(taken, charge=False, max_attempts=1) == []  # even at the limit: nothing counted

    entries = await queue.entries()
    assert [fields[b"id"] for _, fields in entries] == [b"fresh", b"again"]
    assert [Request.decode(fields).attempts for _, fields in entries] == [0, 2]
    # One never charged comes back as it was, not as a suspect (a replica runs those alone, one at a time).
    assert [b"attempts" in fields for _, fields in entries] == [False, True]
    assert not set(taken) & {entry_id for entry_id, _ in entries}  # both are new entries
    assert await queue.pending() == 0
    assert await queue.dead_letters() == []


async def test_with_one_attempt_allowed_a_charged_entry_goes_straight_to_the_dead_letters(queue: Queue) -> None:
    await queue.add("poison")
    await queue.add("theirs", tenant="acme")  # (a dead letter names its tenant: its key's record is the tenant's)
    [(_, original), _] = await queue.entries()
    taken = await queue.take()

    dead = await queue.requeue(taken, charge=True, max_attempts=1)

    assert dead == [
        DeadLetter(request_id="poison", reply_to="streamserve:replies:caller1", deliveries=1, reason=REASON),
        DeadLetter(
            request_id="theirs", reply_to="streamserve:replies:caller1", deliveries=1, tenant="acme", reason=REASON
        ),
    ]
    assert await queue.entries() == []
    assert await queue.pending() == 0
    [(_, lettered), _] = await queue.dead_letters()
    assert lettered[b"reason"] == REASON.encode()
    assert lettered[b"attempts"] == b"1"
    assert {k: v for k, v in lettered.items() if k not in (b"attempts", b"reason")} == original


async def test_a_dead_lettered_or_cancelled_entry_no_longer_counts_against_its_tenant_s_max_queued(
    queue: Queue, settings: Settings
) -> None:
    """Its token in the tenant's held set went only at its deadline: a tenant whose requests a replica's death
    dead-lettered was refused (429, "has N requests queued or running") for as long as request_timeout_s."""
    cancelled = settings.keys.cancelled("rec")
    for tenant in (DEFAULT_TENANT, "acme"):
        tokens = {f"{tenant}-{kind}": now_ms() + 60_000 for kind in ("buried", "dropped", "kept")}
        await queue.redis.zadd(settings.keys.tenant_held("rec", tenant), tokens)  # type: ignore[arg-type]
        await queue.add(f"{tenant}-buried", attempts=1, tenant=tenant, held=f"{tenant}-buried")
        dropped = await queue.add(f"{tenant}-dropped", tenant=tenant, held=f"{tenant}-dropped")
        await queue.redis.zadd(cancelled, {dropped: now_ms() + 60_000})  # its caller cancelled it as it ran
        await queue.add(f"{tenant}-kept", tenant=tenant, held=f"{tenant}-kept")

    dead = await queue.requeue(await queue.take(), charge=True, max_attempts=2)

    assert [letter.request_id for letter in dead] == ["default-buried", "acme-buried"]
    assert [fields[b"id"] for _, fields in await queue.entries()] == [b"default-kept", b"acme-kept"]
    for tenant in (DEFAULT_TENANT, "acme"):  # the one queued again still counts; the others are gone
        assert await queue.redis.zrange(settings.keys.tenant_held("rec", tenant), 0, -1) == [f"{tenant}-kept".encode()]


async def test_an_entry_is_dead_lettered_exactly_at_its_last_allowed_attempt(queue: Queue) -> None:
    max_attempts = 4
    await queue.add("crashes-every-time")
    for attempt in range(1, max_attempts):
        dead = await queue.requeue(await queue.take(), charge=True, max_attempts=max_attempts)
        assert dead == [], f"dead-lettered after {attempt} of {max_attempts} attempts"
        [(_, fields)] = await queue.entries()
        assert fields[b"attempts"] == str(attempt).encode()
        assert await queue.dead_letters() == []

    dead = await queue.requeue(await queue.take(), charge=True, max_attempts=max_attempts)

    assert [d.deliveries for d in dead] == [max_attempts]
    assert [d.request_id for d in dead] == ["crashes-every-time"]
    assert await queue.entries() == []
    [(_, lettered)] = await queue.dead_letters()
    assert lettered[b"attempts"] == str(max_attempts).encode()


async def test_an_id_no_longer_in_the_stream_is_only_acknowledged(queue: Queue) -> None:
    gone = await queue.add("answered")
    await queue.add("still-queued")
    await queue.take(count=1)
    await queue.redis.xdel(queue.stream, gone)  # answered meanwhile: deleted, but still pending in the group
    assert await queue.pending() == 1

    assert await queue.requeue([gone], charge=True, max_attempts=1) == []

    assert [fields[b"id"] for _, fields in await queue.entries()] == [b"still-queued"]  # nothing added
    assert await queue.pending() == 0
    assert await queue.dead_letters() == []


async def test_a_dead_letter_left_untold_by_a_killed_scheduler_is_told_by_the_next(
    queue: Queue, aredis: aioredis.Redis, settings: Settings
) -> None:
    """A scheduler killed between the REQUEUE that dead-lettered a request and telling its caller (or whose answer
    from REQUEUE was lost with its connection): the next full reclaim tells the caller, once."""
    await aredis.xadd("streamserve:replies:caller1", {"opened": "1"})  # the caller's reply stream: it waits
    await queue.add("poison")
    await queue.requeue(await queue.take(), charge=True, max_attempts=1)  # ... and the scheduler died here
    reclaimer = Reclaimer(aredis, settings.keys)
    cfg = DeploymentConfig(name="rec", import_path="x:y")

    await reclaimer.reclaim(cfg, live=set())
    await reclaimer.reclaim(cfg, live=set())

    told = cast(list[Entry], await aredis.xrange("streamserve:replies:caller1"))
    replies = [Reply.decode(fields) for _id, fields in told[1:]]
    assert [(r.request_id, r.status, r.error_type) for r in replies] == [
        ("poison", ReplyStatus.DEAD_LETTER, "DeadLetterError")
    ]
    assert REASON in replies[0].error_message
    assert await aredis.llen(settings.keys.untold_dead_letters("rec")) == 0


async def test_a_dead_letter_whose_caller_cannot_be_told_is_dropped_and_the_rest_told(
    queue: Queue, aredis: aioredis.Redis, settings: Settings
) -> None:
    """Its reply stream is no stream (WRONGTYPE: nothing would mend it): kept at the head of the list, it kept every
    later letter untold, pass after pass."""
    await aredis.xadd("streamserve:replies:caller1", {"opened": "1"})
    poison = Request("poison", "streamserve:replies:broken", now_ms() + 60_000, b"1", "m")
    await aredis.set("streamserve:replies:broken", "not a stream")
    await aredis.xadd(queue.stream, cast(Any, dict(poison.encode())))
    await queue.add("next")
    await queue.requeue(await queue.take(), charge=True, max_attempts=1)

    await Reclaimer(aredis, settings.keys).reclaim(DeploymentConfig(name="rec", import_path="x:y"), live=set())

    told = cast(list[Entry], await aredis.xrange("streamserve:replies:caller1"))
    assert [Reply.decode(fields).request_id for _id, fields in told[1:]] == ["next"]
    assert await aredis.llen(settings.keys.untold_dead_letters("rec")) == 0
