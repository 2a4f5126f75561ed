"""A loopback TCP proxy to Redis that loses Redis's answer to one command (and closes that connection), as a
Redis restarted just after running it, or a network cut, would: the client's retry policy then sends it again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from streamserve.runtime.processes import free_port


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
