"""A cancellation that reached Redis but whose answer was lost with its connection is sent again by the retry
policy, and its second sending finds the request gone: what follows a queued request's cancel must be done all
the same. A loopback proxy between the client and Redis loses Redis's answer to the first CANCEL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.transport.pipelining import Script
from streamserve.wire import scripts
from tests import deployments
from tests.harness.answer_losing_proxy import AnswerLosingProxy
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy

_CANCEL_SHA = Script(scripts.CANCEL).sha.encode()


@pytest.fixture
async def proxy(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[AnswerLosingProxy]:
    await aredis.script_load(scripts.CANCEL)  # so that the first EVALSHA of it runs
    async with AnswerLosingProxy(redis_url, marker=_CANCEL_SHA) as p:
        p.hold_others = False
        yield p


async def test_a_keyed_call_cancelled_while_queued_frees_its_key_though_the_cancel_answer_was_lost(
    proxy: AnswerLosingProxy, settings: Settings, aredis: aioredis.Redis, start_replica: StartReplica
) -> None:
    """The caller leaves while its keyed request is queued; the cancel deletes it, and its answer is lost. The key
    is freed all the same: a retry with it runs, rather than waiting for a run that never comes."""
    await deploy(settings)  # no replica yet: the request stays queued
    stream = settings.keys.requests("rec")
    async with AsyncClient(settings=settings.model_copy(update={"redis_url": proxy.url})) as client:
        call = asyncio.ensure_future(client.call("rec", {"n": 5}, idempotency_key="k5", timeout=30))
        await wait_for_async(lambda: _queued(aredis, stream), 10)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await wait_for_async(lambda: bool(proxy.lost), 10)
        await client._cancels_sent(10)  # (the client waits for them at close too)
    assert proxy.lost.startswith(b"*1"), f"the answer lost was not the cancel's: {proxy.lost!r}"
    assert await aredis.xlen(stream) == 0
    deployments.CALLS.clear()
    await start_replica()
    async with AsyncClient(settings=settings) as client:
        answer = await asyncio.wait_for(client.call("rec", {"n": 5}, idempotency_key="k5", timeout=10), 20)
    assert answer["body"] == {"n": 5}
    assert deployments.CALLS == [{"n": 5}]


async def _queued(aredis: aioredis.Redis, stream: str) -> bool:
    return bool(await aredis.xlen(stream))
