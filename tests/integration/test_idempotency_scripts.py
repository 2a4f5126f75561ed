"""The shared-run scripts for idempotency keys on a real redis-server: ENQUEUE_SHARED through the client's
``enqueue_shared`` (queue, join, replay, refuse) and SETTLE_RUN through ``settling`` (store, release, answer the
callers that joined), and the reclaimer's REQUEUE naming a dead-lettered request's key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamserve.client.shared_calls import Admission, by_key, enqueue_shared
from streamserve.runtime.settings import Settings
from streamserve.transport import settling
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import Requeuer, ensure_group
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import IdempotencyKeyMismatchError, OverloadedError, ReplyNotStoredError
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import SHARED_STORED, Reply, ReplyStatus, Request, now_ms
from streamserve.wire.shared_runs import new_run_token

CFG = DeploymentConfig(name="keyed", import_path="m:f", max_queued_requests=2, idempotency_ttl_s=60)
KEYS = Keys()
KEY = "order-17"
CALLER = "streamserve:replies:caller1"


@pytest.fixture
async def pipeliner(aredis: aioredis.Redis) -> AsyncIterator[Pipeliner]:
    await ensure_group(aredis, KEYS.requests(CFG.name))
    pipeliner = Pipeliner(aredis)
    yield pipeliner
    await pipeliner.aclose()


def keyed(request_id: str, body: bytes = b'{"x":1}', reply_to: str = CALLER) -> Request:
    return Request(request_id, reply_to, now_ms() + 60_000, body, tag=f"t-{request_id}", idem=KEY, run=new_run_token())


async def settle(redis: aioredis.Redis, request: Request, reply: Reply) -> list[Any]:
    """What a replica's Finisher does for a keyed request: SETTLE_RUN; the answers to the callers that joined."""
    settlement = settling.settle(KEYS, CFG, request, reply)
    return settlement.answers(await redis.execute_command(*settlement.with_source()))


async def enqueue_keyed(pipeliner: Pipeliner, keys: Keys, cfg: DeploymentConfig, request: Request) -> Admission:
    return await enqueue_shared(pipeliner, keys, cfg, request, by_key(keys, cfg, request))


async def test_the_first_call_queues_a_run_the_next_join_it_and_later_ones_get_its_reply(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    first = keyed("r1")
    queued = await enqueue_keyed(pipeliner, KEYS, CFG, first)
    assert queued.entry_id and not queued.joined
    record = await aredis.hgetall(KEYS.idempotency(CFG.name, KEY))
    assert record[b"state"] == b"running"
    assert record[b"run"] == first.run.encode()
    assert record[b"entry"] == queued.entry_id.encode()
    assert 0 < await aredis.pttl(KEYS.idempotency(CFG.name, KEY)) <= 120_000
    # The same call sent again (its answer lost with the connection) is recognised as itself.
    assert (await enqueue_keyed(pipeliner, KEYS, CFG, first)).entry_id == queued.entry_id
    assert await aredis.xlen(KEYS.requests(CFG.name)) == 1

    joined = await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r2", reply_to="streamserve:replies:caller2"))
    assert joined.joined and not joined.entry_id
    assert await aredis.xlen(KEYS.requests(CFG.name)) == 1

    reply = first.reply(ReplyStatus.OK, "keyed#a", body=b'{"done":true}')
    answers = await settle(aredis, first, reply)
    assert [command[1] for command in answers] == ["streamserve:replies:caller2"]
    fields = dict(zip(answers[0][7::2], answers[0][8::2], strict=True))
    assert fields["id"] == "r2"
    assert fields["tag"] == "t-r2"
    assert fields["status"] == "ok"
    assert fields["body"] == b'{"done":true}'
    assert not await aredis.exists(KEYS.idempotency_waiters(CFG.name, KEY))
    assert 55_000 < await aredis.pttl(KEYS.idempotency(CFG.name, KEY)) <= 60_000
    stored = await aredis.hgetall(KEYS.idempotency(CFG.name, KEY))
    assert b"error_type" not in stored and b"error_message" not in stored  # a result keeps no empty error fields

    later = await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r3"))
    assert later.stored is not None
    assert later.stored.shared == SHARED_STORED
    assert (later.stored.request_id, later.stored.tag) == ("r3", "t-r3")
    assert (later.stored.status, later.stored.body, later.stored.replica_id) == (
        ReplyStatus.OK,
        b'{"done":true}',
        "keyed#a",
    )
    # The same JSON value, written otherwise, is the same body.
    assert (await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r4", body=b'{ "x" : 1 }'))).stored is not None
    assert await aredis.xlen(KEYS.requests(CFG.name)) == 1


async def test_a_run_settles_once_and_a_late_second_end_changes_nothing(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    """A replica cut off from Redis mid-run is written off and its request run again by another; the first end
    stands, and the cut-off replica's late reply (or a release: its run cancelled) neither replaces nor frees it."""
    first = keyed("r1")
    await enqueue_keyed(pipeliner, KEYS, CFG, first)
    await settle(aredis, first, first.reply(ReplyStatus.OK, "keyed#b", body=b'{"receipt":"from b"}'))
    await settle(aredis, first, first.reply(ReplyStatus.OK, "keyed#a", body=b'{"receipt":"from a"}'))
    await settle(aredis, first, first.reply(ReplyStatus.CANCELLED, "keyed#a"))
    later = await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r2"))
    assert later.stored is not None
    assert (later.stored.body, later.stored.replica_id) == (b'{"receipt":"from b"}', "keyed#b")


async def test_another_body_with_the_key_is_refused(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r1"))
    with pytest.raises(IdempotencyKeyMismatchError, match="another method, model or body"):
        await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r2", body=b'{"x":2}'))
    other_method = keyed("r3")
    other_method.method = "other"
    with pytest.raises(IdempotencyKeyMismatchError):
        await enqueue_keyed(pipeliner, KEYS, CFG, other_method)


async def test_a_full_queue_makes_no_record(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    for n in range(2):
        await aredis.xadd(KEYS.requests(CFG.name), dict(Request(f"u{n}", CALLER, 0, b"1").encode()))
    with pytest.raises(OverloadedError):
        await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r1"))
    assert not await aredis.exists(KEYS.idempotency(CFG.name, KEY))


async def test_a_run_that_never_ran_frees_the_key_and_tells_its_waiters_to_retry(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    first = keyed("r1")
    await enqueue_keyed(pipeliner, KEYS, CFG, first)
    await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r2"))
    answers = await settle(aredis, first, first.reply(ReplyStatus.DEADLINE_EXCEEDED, "keyed#a"))
    assert not await aredis.exists(KEYS.idempotency(CFG.name, KEY))
    assert [dict(zip(a[7::2], a[8::2], strict=True))["status"] for a in answers] == ["retry"]
    # A cancelled run too, released by whoever cancelled it.
    again = keyed("r3")
    assert (await enqueue_keyed(pipeliner, KEYS, CFG, again)).entry_id
    await settling.release(aredis, KEYS, CFG.name, again)
    assert not await aredis.exists(KEYS.idempotency(CFG.name, KEY))


async def test_each_tenant_has_a_record_of_its_own_for_a_key(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    mine, theirs = keyed("r1"), keyed("r2", body=b'{"x":2}')
    theirs.tenant = "acme"
    assert (await enqueue_keyed(pipeliner, KEYS, CFG, mine)).entry_id
    assert (await enqueue_keyed(pipeliner, KEYS, CFG, theirs)).entry_id  # queued: no mismatch, no joining
    assert await aredis.hget(KEYS.idempotency(CFG.name, KEY, "acme"), "run") == theirs.run.encode()
    await settling.release(aredis, KEYS, CFG.name, theirs)
    assert not await aredis.exists(KEYS.idempotency(CFG.name, KEY, "acme"))
    assert await aredis.hget(KEYS.idempotency(CFG.name, KEY), "run") == mine.run.encode()


async def test_a_handler_error_is_stored_and_a_too_large_reply_is_not(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    first = keyed("r1")
    await enqueue_keyed(pipeliner, KEYS, CFG, first)
    await settle(aredis, first, first.reply(ReplyStatus.USER_ERROR, "a", error_type="E", error_message="boom"))
    stored = (await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r2"))).stored
    assert stored is not None and (stored.status, stored.error_type, stored.error_message) == (
        ReplyStatus.USER_ERROR,
        "E",
        "boom",
    )
    await aredis.delete(KEYS.idempotency(CFG.name, KEY))
    big = keyed("r3")
    await enqueue_keyed(pipeliner, KEYS, CFG, big)
    too_large = big.reply(ReplyStatus.USER_ERROR, "a", error_type="ResponseTooLargeError", error_message="2000 bytes")
    await settle(aredis, big, too_large)
    assert b"body" not in await aredis.hgetall(KEYS.idempotency(CFG.name, KEY))
    with pytest.raises(ReplyNotStoredError, match="2000 bytes"):
        await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r4"))


async def test_a_stale_run_settles_nothing(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    """A run whose record lapsed, and was made again by another run, leaves that run's record and waiters alone."""
    stale = keyed("r0")
    current = keyed("r1")
    await enqueue_keyed(pipeliner, KEYS, CFG, current)
    await enqueue_keyed(pipeliner, KEYS, CFG, keyed("r2"))
    assert await settle(aredis, stale, stale.reply(ReplyStatus.OK, "a", body=b"1")) == []
    assert (await aredis.hget(KEYS.idempotency(CFG.name, KEY), "state")) == b"running"
    assert await aredis.llen(KEYS.idempotency_waiters(CFG.name, KEY)) == 1


async def test_the_reclaimer_learns_the_key_of_a_dead_lettered_request(
    aredis: aioredis.Redis, pipeliner: Pipeliner, settings: Settings
) -> None:
    request = keyed("r1")
    await enqueue_keyed(pipeliner, KEYS, CFG, request)
    await aredis.xreadgroup(CONSUMER_GROUP, "keyed#dead", {KEYS.requests(CFG.name): ">"})
    [entry] = await aredis.xpending_range(KEYS.requests(CFG.name), CONSUMER_GROUP, "-", "+", 10)
    [dead] = await Requeuer(aredis, KEYS).requeue(
        CFG.name, [entry["message_id"]], charge=True, max_delivery_attempts=1, reason="died"
    )
    assert (dead.request_id, dead.tag, dead.idem, dead.run) == ("r1", "t-r1", KEY, request.run)
