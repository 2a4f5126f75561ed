"""An enqueue that reached Redis but whose answer was lost with its connection (Redis restarted just after running
it, a network cut) is sent again by the retry policy, and must not add the request a second time.

A loopback proxy between the client and Redis forwards everything, except that once it drops Redis's answer to
the first enqueue (EVALSHA) and closes that connection; the client reconnects through it and sends again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire import scripts
from tests import deployments
from tests.harness.answer_losing_proxy import AnswerLosingProxy
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy


@pytest.fixture
async def proxy(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[AnswerLosingProxy]:
    await aredis.script_load(scripts.ENQUEUE)  # so that the first EVALSHA runs (an answer of NOSCRIPT proves nothing)
    async with AnswerLosingProxy(redis_url) as p:
        yield p


def assert_lost_an_entry_id(proxy: AnswerLosingProxy) -> None:
    assert proxy.lost.startswith(b"$"), f"the answer lost was not a new entry's id: {proxy.lost!r}"


async def test_a_queued_request_whose_enqueue_answer_was_lost_is_queued_once(
    proxy: AnswerLosingProxy, settings: Settings, aredis: aioredis.Redis
) -> None:
    await deploy(settings)  # no replica: the request stays queued
    async with AsyncClient(settings=settings.model_copy(update={"redis_url": proxy.url})) as client:
        request_id = await client.send("rec", {"n": 1})
    assert_lost_an_entry_id(proxy)
    entries = await aredis.xrange(settings.keys.requests("rec"))
    assert [fields[b"id"].decode() for _id, fields in entries] == [request_id]


async def test_a_request_already_run_when_its_lost_enqueue_is_sent_again_runs_once(
    proxy: AnswerLosingProxy, settings: Settings, aredis: aioredis.Redis, start_replica: StartReplica
) -> None:
    """The replica ran it and replied before the caller learnt it was queued: the entry is gone from the request
    stream, but its reply is in the caller's reply stream."""
    await start_replica()
    deployments.CALLS.clear()
    stream = settings.keys.requests("rec")

    async def run_first() -> None:
        await wait_for_async(lambda: deployments.CALLS == [{"n": 2}], 10)
        await wait_for_async(lambda: _equals(aredis.xlen(stream), 0), 10)  # replied, acknowledged and deleted

    proxy.before_losing = run_first
    async with AsyncClient(settings=settings.model_copy(update={"redis_url": proxy.url})) as client:
        answer = await asyncio.wait_for(client.call("rec", {"n": 2}, timeout=10), 20)
    assert_lost_an_entry_id(proxy)
    assert answer["body"] == {"n": 2}
    assert await aredis.xlen(stream) == 0, "the request was queued a second time"
    assert deployments.CALLS == [{"n": 2}]


async def test_an_enqueue_sent_again_after_the_caller_got_its_reply_adds_nothing(
    proxy: AnswerLosingProxy, settings: Settings, aredis: aioredis.Redis, start_replica: StartReplica
) -> None:
    """What is sent again is decided when it is sent, not when the connection failed: while the caller was
    reconnecting, the replica ran the request, and the caller read its reply and trimmed it from its stream."""
    await start_replica()
    deployments.CALLS.clear()
    stream = settings.keys.requests("rec")
    proxy.hold_others = False
    async with AsyncClient(settings=settings.model_copy(update={"redis_url": proxy.url})) as client:
        replies = client._replies
        assert replies is not None

        reconnected = proxy.new_connections_wait = asyncio.Event()
        tag = client.new_tag()

        async def answered_meanwhile() -> None:
            await wait_for_async(lambda: deployments.CALLS == [{"n": 3}], 10)
            await wait_for_async(lambda: not replies.waits_for(tag), 10)
            await aredis.xtrim(replies.name, maxlen=0)  # as its reader trims what it has read
            reconnected.set()

        call = asyncio.ensure_future(client.request("rec", b'{"n": 3}', request_id="lost-3", timeout=10, tag=tag))
        await wait_for_async(lambda: bool(proxy.lost), 10)
        await answered_meanwhile()
        reply = await asyncio.wait_for(call, 20)
    assert_lost_an_entry_id(proxy)
    assert reply.request_id == "lost-3"
    assert await aredis.xlen(stream) == 0, "the request was queued a second time"
    assert deployments.CALLS == [{"n": 3}]


async def test_a_caller_that_left_while_its_lost_enqueue_was_sent_again_leaves_nothing_queued(
    proxy: AnswerLosingProxy, settings: Settings, aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller's task is cancelled while the client reconnects to learn whether its request was queued: it was,
    and it is then cancelled, never left to run for nobody."""
    await deploy(settings)  # no replica: the request stays queued unless it is cancelled
    stream = settings.keys.requests("rec")
    proxy.hold_others = False
    async with AsyncClient(settings=settings.model_copy(update={"redis_url": proxy.url})) as client:
        reconnected = proxy.new_connections_wait = asyncio.Event()
        call = asyncio.ensure_future(client.call("rec", {"n": 4}, timeout=30))
        await wait_for_async(lambda: bool(proxy.lost), 10)
        assert await aredis.xlen(stream) == 1
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        reconnected.set()
        await wait_for_async(lambda: _equals(aredis.xlen(stream), 0), 10)
    assert_lost_an_entry_id(proxy)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def _equals(awaitable: Awaitable[int], expected: int) -> bool:
    return await awaitable == expected
