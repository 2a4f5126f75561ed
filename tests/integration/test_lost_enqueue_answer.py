"""An enqueue that reached Redis but whose answer was lost with its connection (Redis restarted just after running
it, a network cut) is sent again by the retry policy, and must not add the request a second time.

A loopback proxy between the client and Redis forwards everything, except that once it drops Redis's answer to
the first enqueue (EVALSHA) and closes that connection; the client reconnects through it and sends again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.wire import scripts
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy


class AnswerLosingProxy:
    """Forwards loopback TCP to Redis; loses Redis's answer to the first command containing ``marker``.

    From then until the answer to the enqueue sent again has gone through, it holds back what Redis sends on
    the connections opened before (the caller's reply reader), unless ``hold_others`` is off: the caller cannot
    have read its reply meanwhile. ``new_connections_wait``, when given, holds connections opened after the
    loss until it is set (a client reconnecting slowly).
    """

    def __init__(self, redis_url: str, marker: bytes = b"EVALSHA") -> None:
        target = urlsplit(redis_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 6379)
        self.port = free_port()
        self.url = redis_url.replace(f":{target.port}", f":{self.port}", 1)
        self._marker = marker
        self.lost = b""  # the answer dropped, once it was
        self.before_losing: Callable[[], Awaitable[None]] | None = None  # runs before the connection is closed
        self._armed = True
        self.hold_others = True
        self.new_connections_wait: asyncio.Event | None = None
        self._connections = 0
        self._lost_after = -1  # connections opened up to this one are held until the enqueue was sent again
        self._resent = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AnswerLosingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._connections += 1
        number = self._connections
        marked, resending = asyncio.Event(), asyncio.Event()

        async def upstream() -> None:
            if self.new_connections_wait is not None and self.lost:
                await self.new_connections_wait.wait()
            while data := await reader.read(65536):
                if self._armed and self._marker in data:
                    self._armed = False
                    self._lost_after = number
                    marked.set()
                if b"ENQUEUE sent again" in data:
                    resending.set()
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if marked.is_set():  # Redis's answer to the marked command: lose it, and the connection
                    if self.before_losing is not None:
                        await self.before_losing()
                    self.lost = data
                    return
                if self.hold_others and number <= self._lost_after:
                    await self._resent.wait()
                writer.write(data)
                await writer.drain()
                if resending.is_set():
                    self._resent.set()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(ConnectionError):
                    await w.wait_closed()


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


async def _equals(awaitable: Awaitable[int], expected: int) -> bool:
    return await awaitable == expected
