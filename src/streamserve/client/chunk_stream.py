"""What ``AsyncClient.stream`` returns: an async iterator over one streamed call's chunks, decoded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Self

import orjson

from streamserve.client.chunk_feed import ChunkFeed
from streamserve.client.outcomes import result_of
from streamserve.wire.errors import RequestCancelledError
from streamserve.wire.messages import Reply

# Sends the request; its first reply when that is a unary answer (or an error), else the stream's feed.
Start = Callable[[], Awaitable[Reply | ChunkFeed]]
# What a read raises once a read of the stream was cancelled (which cancels its request): not the end of a stream.
CANCELLED = (
    "this stream was cancelled when a read of it was cancelled (a timeout of asyncio.wait_for, say), and so was its "
    "request: nothing more comes; start a new stream to read again"
)
# What its first read raises when the stream is closed (from another task or thread) while that read sends it.
CLOSED_WHILE_STARTING = "this stream was closed while its first read sent it: its request is cancelled"


class ConcurrentReadError(RuntimeError):
    """A stream was read from two tasks or threads at once: the second read is refused (the first goes on)."""


class ChunkStream:
    """An async iterator of a streaming handler's chunks, each decoded from its JSON.

    >>> async for token in client.stream("tokens", {"prompt": "hi"}):
    ...     print(token)

    The request is sent by the first ``__anext__``. An error ends the iteration by raising the StreamServeError that
    ``call`` would raise for it, after the chunks that came before it. A deployment that does not stream gives its one
    result as the only chunk. ``break``, ``close()``, ``aclose()`` or leaving ``async with`` before the end cancel
    the request: its generator is closed, and chunks still to come are dropped. A read cancelled (its task, or
    ``asyncio.wait_for``'s timeout) cancels the request too, and the reads after it raise RequestCancelledError.
    """

    def __init__(self, start: Start) -> None:
        self._start: Start | None = start
        self._feed: ChunkFeed | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the client's, where the feed lives
        self._reading = False  # a read is under way (another one at once is refused)
        self._cancelled = False  # a read was cancelled (and the request with it)
        self._starting: asyncio.Task[Any] | None = None  # the task whose first read sends the request, meanwhile
        self._closed = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        if self._reading:
            # Two readers at once: the second one's wait replaced the first one's, which then waited for ever (or, at
            # the start, the second saw a stream already over).
            raise ConcurrentReadError("this stream is being read already: read a stream from one task or thread")
        self._reading = True
        try:
            feed = self._feed
            if feed is None:
                if self._start is None:  # closed, ended, or a unary answer given
                    if self._cancelled:
                        raise RequestCancelledError(CANCELLED)
                    raise StopAsyncIteration
                start, self._start = self._start, None
                first = await self._started(start)
                if not isinstance(first, ChunkFeed):
                    return result_of(first)  # a unary deployment's result, the stream's one chunk (or its error)
                self._feed = feed = first
                self._loop = asyncio.get_running_loop()
            try:
                chunk = await feed.next_chunk()
            except BaseException as exc:
                self._cancelled = isinstance(exc, asyncio.CancelledError)
                self.close()
                raise
            if chunk is None:
                self.close()
                raise StopAsyncIteration
            return orjson.loads(chunk)
        finally:
            self._reading = False

    async def _started(self, start: Start) -> Reply | ChunkFeed:
        """What ``start`` gives; RequestCancelledError when the stream is closed meanwhile (which cancels the request
        then: it may wait in the queue, or for a model to load, long before its first chunk)."""
        task = self._starting = asyncio.current_task()
        try:
            first = await start()
        except asyncio.CancelledError:
            if self._closed and task is not None and task.uncancel() == 0:  # cancelled by close() alone
                raise RequestCancelledError(CLOSED_WHILE_STARTING) from None
            self._cancelled = True
            raise
        finally:
            self._starting = None
        if self._closed:  # closed as its answer came
            if isinstance(first, ChunkFeed):
                first.close()
            raise RequestCancelledError(CLOSED_WHILE_STARTING)
        return first

    def close(self) -> None:
        """Stop here: the request is cancelled if it has not ended, and chunks still to come are dropped. Safe to call
        again."""
        self._closed = True
        self._start = None
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.close()
        starting = self._starting
        if starting is not None and starting is not asyncio.current_task():
            starting.cancel()  # the first read, which is sending the request, elsewhere

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An iteration left with ``break`` drops its last reference here, on the client's loop; a blocking Client's
        # stream, in whatever thread drops it (its client closed meanwhile): its feed is closed on the loop.
        feed = getattr(self, "_feed", None)
        if feed is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.close()
        elif self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: what the stream held went with it
                self._loop.call_soon_threadsafe(feed.close)
