"""ENQUEUE_AGAIN (the enqueue sent again after its answer was lost) finds the first sending of this very call, by
its request id and its call tag together: a caller may give two calls one request id (X-Request-ID), and the other
call's entry, or its reply, is not this one's (taken for it, this call was never queued and waited for its timeout).
"""

from __future__ import annotations

import uuid
from typing import Any, cast

import redis.asyncio as aioredis

from streamserve.client.calls import FIND_ONLY
from streamserve.runtime.settings import Settings
from streamserve.wire import scripts
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms

REQUEST_ID = "shared-id"


def fields_of(request: Request) -> list[Any]:
    return [part for item in request.encode().items() for part in item]


async def enqueue_again(aredis: aioredis.Redis, stream: str, replies: str, request: Request, limit: int = 100) -> str:
    """What Calls._add sends again for ``request``: the id of the entry found or added ("" for none, FIND_ONLY)."""
    args = [limit, CONSUMER_GROUP, request.request_id, "", "", *fields_of(request)]
    found = await aredis.eval(scripts.ENQUEUE_AGAIN, 2, stream, replies, *args)  # type: ignore[misc]
    return "" if found is None else cast(bytes, found).decode()


def call(tag: str, replies: str) -> Request:
    return Request(REQUEST_ID, replies, now_ms() + 60_000, b"1", tag=tag)


async def test_another_calls_entry_or_reply_with_the_same_request_id_is_not_this_calls(
    aredis: aioredis.Redis, settings: Settings
) -> None:
    name = f"again-{uuid.uuid4().hex[:8]}"
    stream, replies = settings.keys.requests(name), f"{name}:replies"
    await aredis.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
    first = await aredis.xadd(stream, cast(Any, call("t1", replies).encode()))
    # The first call is queued: the second, sent again with the same request id, is added beside it.
    second = await enqueue_again(aredis, stream, replies, call("t2", replies))
    assert second != first.decode()
    assert await aredis.xlen(stream) == 2
    # ... and sent once more (its answer lost again), it finds its own entry.
    assert await enqueue_again(aredis, stream, replies, call("t2", replies)) == second
    assert await aredis.xlen(stream) == 2
    # A reply to the same request id for another call is not this call's either.
    await aredis.xadd(replies, cast(Any, Reply(REQUEST_ID, ReplyStatus.OK, "r1", body=b"1", tag="t1").encode()))
    third = await enqueue_again(aredis, stream, replies, call("t3", replies))
    assert third not in (first.decode(), second)
    # The reply to this call is: it ran already, nothing is added (and no id is given: a reply's is no entry's).
    await aredis.xadd(replies, cast(Any, Reply(REQUEST_ID, ReplyStatus.OK, "r1", body=b"1", tag="t4").encode()))
    assert await enqueue_again(aredis, stream, replies, call("t4", replies)) == "answered"
    assert await aredis.xlen(stream) == 3


async def test_for_a_caller_that_left_it_only_looks(aredis: aioredis.Redis, settings: Settings) -> None:
    """A caller cancelled, gone over HTTP or past its deadline while its enqueue was sent again: what is found is
    cancelled; what is not is never added (a replica might run it for nobody before the cancel came)."""
    name = f"again-{uuid.uuid4().hex[:8]}"
    stream, replies = settings.keys.requests(name), f"{name}:replies"
    await aredis.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
    queued = await aredis.xadd(stream, cast(Any, call("t1", replies).encode()))
    assert await enqueue_again(aredis, stream, replies, call("t1", replies), FIND_ONLY) == queued.decode()
    assert await enqueue_again(aredis, stream, replies, call("t2", replies), FIND_ONLY) == ""
    assert await aredis.xlen(stream) == 1
