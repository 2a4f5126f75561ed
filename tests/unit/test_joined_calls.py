"""A call that joined another's shared run (client/shared_calls.wait_joined) and looks at the run's record when its
copy of the reply is slow: a record gone at one look is a run that just ended, whose copy is on its way."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest

from streamserve.client import shared_calls
from streamserve.client.shared_calls import Sharing, wait_joined
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms

SHARING = Sharing("cache:record", "cache:waiters")


def joined_request() -> Request:
    return Request("req-1", "replies", now_ms() + 60_000, b"{}", tag="t1")


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_calls, "JOINED_CHECK_FIRST_S", 0.01)


async def test_a_record_gone_at_one_look_waits_for_the_copy_on_its_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed run of identical requests deletes its record and sends its waiters its error: a look between the two
    must not send the call again (it would run the handler a second time for a caller that gets the first's error)."""
    redis = fakeredis.FakeAsyncRedis()
    fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    error = Reply("req-1", ReplyStatus.USER_ERROR, "r#1", error_type="ValueError", error_message="failed", tag="t1")
    real_look = shared_calls.look_at_record
    looks = 0

    async def look_then_the_copy_comes(*args: Any) -> Reply | None:
        nonlocal looks
        looks += 1
        found = await real_look(*args)
        if not fut.done():
            fut.get_loop().call_soon(fut.set_result, error)
        return found

    monkeypatch.setattr(shared_calls, "look_at_record", look_then_the_copy_comes)
    reply = await wait_joined(redis, SHARING, joined_request(), fut, "cached", lambda: False)
    assert (reply.status, reply.error_message, looks) == (ReplyStatus.USER_ERROR, "failed", 1)


async def test_a_record_gone_at_two_looks_sends_the_call_again() -> None:
    """Its copy was lost (the replica died between settling and answering): it runs anew."""
    redis = fakeredis.FakeAsyncRedis()
    fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    reply = await wait_joined(redis, SHARING, joined_request(), fut, "cached", lambda: False)
    assert reply.status is ReplyStatus.RETRY


async def test_a_record_done_at_a_look_gives_the_stored_reply() -> None:
    redis = fakeredis.FakeAsyncRedis()
    await redis.hset(
        SHARING.record,
        mapping={"state": "done", "status": "ok", "body": b'{"x":1}', "replica": "r#1", "digest": ""},
    )
    fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    reply = await wait_joined(redis, SHARING, joined_request(), fut, "cached", lambda: False)
    assert (reply.status, reply.body, reply.request_id, reply.tag) == (ReplyStatus.OK, b'{"x":1}', "req-1", "t1")
