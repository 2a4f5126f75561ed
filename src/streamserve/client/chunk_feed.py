"""One streamed request's chunks, between the reply reader that brings them and the consumer that takes them.

The reply reader adds each reply of the stream (its chunks, ``add_chunks``, then one final reply, ``add``); the
consumer takes the chunks in order, a message's worth at a time (``next_batch``, the gateway) or one by one
(``next_chunk``, the Python client). What the feed holds is bounded by flow control, not here: the replica runs at
most ``window`` chunks ahead of what the consumer has taken, and the feed tells it how far that is (``report``) once
the consumer has taken at least ``max(1, window // 2)`` chunks beyond what it last said.

A consumer that can write chunks where they go without waiting (the gateway: on the HTTP socket) sets ``sink``.
While it waits for chunks, those that come are not handed to it: the reply reader ``flush``es each feed it added to
once it has taken in all that one read brought, and the feed gives them to ``sink`` at once, as one write: no
wake-up, no task switch per chunk. Where ``sink`` cannot take them (the client reads slowly), the consumer is woken
as usual.

Retries: a replica that dies mid-stream leaves its request to another one, which runs the handler again from chunk
0 under the same request id. The feed keeps the index of the next chunk it expects and drops every chunk below it,
so a deterministic handler continues seamlessly; it reports to whichever replica sent the latest chunk.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable

from streamserve.client.outcomes import error_of
from streamserve.wire.errors import ProtocolError, RequestCancelledError
from streamserve.wire.messages import Reply, ReplyStatus

# Tells the replica (by id) serving the stream how many chunks the consumer has taken.
Report = Callable[[str, int], None]


class ChunkFeed:
    """The chunks of one stream not yet taken, its end once it came, and how far its consumer has read."""

    __slots__ = (
        "_batches",
        "_expired",
        "_failed",
        "_final",
        "_flush_due",
        "_offset",
        "_reported",
        "_taken",
        "_waiter",
        "_window",
        "deadline",
        "next_index",
        "on_close",
        "replica_id",
        "report",
        "request_id",
        "sink",
    )

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        # Messages' bodies not yet taken, each ``count`` chunks joined by b"\n"; the first one taken up to _offset.
        self._batches: deque[tuple[bytes, int]] = deque()
        self._offset = 0
        self.next_index = 0  # the index of the next chunk to keep: how many chunks have come, duplicates dropped
        self._taken = 0
        self._reported = 0  # the ``read`` last told to replica_id
        self._window = 0
        self.replica_id = ""
        self._final: Reply | None = None  # the reply that ended the stream, after the chunks still held
        self._failed: BaseException | None = None  # ends the stream at once (Redis gone, caller gone)
        self._expired: BaseException | None = None  # ends the stream after the chunks held (its deadline passed)
        self._waiter: asyncio.Future[None] | None = None
        # Set by whoever sends the request (the client): where progress goes, what closing does, the deadline
        # (event-loop time) that ``fail`` will be called at.
        self.report: Report | None = None
        self.on_close: Callable[[], None] | None = None
        self.deadline = float("inf")
        # Set by a consumer that writes chunks without waiting: takes chunks joined by b"\n", or says False.
        self.sink: Callable[[bytes], bool] | None = None
        self._flush_due = False

    @classmethod
    def ended(cls, final: Reply, chunks: bytes = b"") -> ChunkFeed:
        """The feed of a stream that is over already: its first reply ended it (END after no chunk), or it was kept
        for a shared run, its ``chunks`` (joined by b"\n") then ``final``."""
        feed = cls(final.request_id)
        if chunks:
            feed.next_index = chunks.count(b"\n") + 1
            feed._batches.append((chunks, feed.next_index))
        feed.add(final)
        return feed

    @property
    def finished(self) -> bool:
        """Whether the stream's final reply has come (its handler is done)."""
        return self._final is not None

    @property
    def expired(self) -> bool:
        """Whether the stream's deadline passed (``expire``): it ends once its consumer has taken what it holds."""
        return self._expired is not None

    @property
    def failed(self) -> bool:
        """Whether the stream was ended at once (``fail``) or closed."""
        return self._failed is not None

    # -- the reply reader's side ----------------------------------------------------

    def add(self, reply: Reply) -> None:
        """Take in one reply of this stream: chunks (a CHUNK, see ``add_chunks``) or its end; later replies are
        ignored."""
        if reply.status is ReplyStatus.CHUNK:
            self.add_chunks(reply.replica_id, reply.window, reply.seq, reply.count, reply.body)
            return
        if self._final is not None or self._failed is not None or self._expired is not None:
            return  # a late duplicate (a second replica's end), nobody reads any more, or too late
        if reply.status is ReplyStatus.END and reply.seq > self.next_index:
            self.fail(ProtocolError(f"stream {self.request_id} ended after {reply.seq} chunks, {self.next_index} came"))
            return
        self._final = reply
        self._wake()

    def add_chunks(self, replica_id: str, window: int, seq: int, count: int, body: bytes) -> bool:
        """Take in chunks ``seq`` to ``seq + count - 1`` (``body``: joined by b"\\n") that ``replica_id`` sent, whose
        ``window`` is its max_unread_chunks; those that came already are dropped. True when the reader must
        ``flush`` this feed once it has taken in the rest of its read (see the module)."""
        if self._final is not None or self._failed is not None or self._expired is not None:
            return False  # a late duplicate, nobody reads any more, or too late
        self._window = window
        if replica_id != self.replica_id:  # the first chunk, or another replica runs the handler again
            self.replica_id, self._reported = replica_id, 0
            self._report_if_due()
        end = seq + count
        if end <= self.next_index or count <= 0:
            return False  # all of them came already
        if seq < self.next_index:  # a re-run catching up: keep what is new
            body = _after_lines(body, self.next_index - seq)
        elif seq > self.next_index:
            self.fail(ProtocolError(f"stream {self.request_id} skipped chunks {self.next_index} to {seq - 1}"))
            return False
        self._batches.append((body, end - self.next_index))
        self.next_index = end
        if self.sink is not None and self._waiting():  # its consumer waits: the sink takes them at once
            first, self._flush_due = not self._flush_due, True
            return first
        self._wake()
        return False

    def flush(self) -> None:
        """Give what came to ``sink`` in one piece, or wake the consumer if it cannot take it now."""
        self._flush_due = False
        # (nothing held: taken meanwhile; not waiting: its consumer is busy and takes them when it is done)
        if self._batches and self._waiting() and self.sink is not None and not self.write_now(self.sink):
            self._wake()

    def write_now(self, write: Callable[[bytes], bool]) -> bool:
        """Give every chunk held to ``write`` in one piece, if there are some and it takes them (True); else keep
        them for ``next_batch``."""
        if self._failed is not None or not self._batches:
            return False
        body, count = self._joined()
        if not write(body):
            return False
        self._batches.clear()
        self._offset = 0
        self._took(count)
        return True

    def expire(self, exc: BaseException) -> None:
        """End the stream with ``exc`` once its consumer has taken the chunks held now (its deadline passed: what
        came before is the consumer's, as before an error the handler raised); nothing is taken in after."""
        if self._failed is None and self._final is None and self._expired is None:
            self._expired = exc
            self._wake()

    def fail(self, exc: BaseException) -> None:
        """End the stream at once with ``exc`` (the chunks still held are dropped): Redis was lost, the client
        closed, or the consumer went away."""
        if self._failed is None:
            self._failed = exc
            self._batches.clear()
            self._wake()

    # -- the consumer's side ------------------------------------------------------------

    async def next_batch(self) -> bytes | None:
        """Every chunk that has come and is not yet taken, joined by b"\\n" (each one compact JSON), waiting for one
        if there is none; None once the stream ended well. Raises the stream's error after its chunks."""
        while True:
            if self._failed is not None:
                raise self._failed
            if self._batches:
                return self._take_all()
            if self._expired is not None:
                raise self._expired
            if self._final is not None:
                self._raise_if_failed()
                return None
            await self._wait()

    async def next_chunk(self) -> bytes | None:
        """The next chunk (compact JSON), waiting for it; None once the stream ended well. Raises the stream's error
        after its chunks."""
        while True:
            if self._failed is not None:
                raise self._failed
            if self._batches:
                return self._take_one()
            if self._expired is not None:
                raise self._expired
            if self._final is not None:
                self._raise_if_failed()
                return None
            await self._wait()

    def close(self) -> None:
        """The consumer is done with the stream (ended, failed or left early): forget the request."""
        self.fail(RequestCancelledError(f"stream {self.request_id} was closed"))  # (a read under way, elsewhere)
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()

    # -- inside -------------------------------------------------------------------------

    def _take_all(self) -> bytes:
        body, count = self._joined()
        self._batches.clear()
        self._offset = 0
        self._took(count)
        return body

    def _joined(self) -> tuple[bytes, int]:
        """Every chunk held (not yet taken), joined by b"\\n", and how many; taking nothing."""
        body, count = self._batches[0]
        if self._offset:
            body, count = body[self._offset :], count - body.count(b"\n", 0, self._offset)
        if len(self._batches) > 1:
            parts = [body]
            for more, more_count in itertools.islice(self._batches, 1, None):
                parts.append(more)
                count += more_count
            body = b"\n".join(parts)
        return body, count

    def _take_one(self) -> bytes:
        body, _count = self._batches[0]
        start = self._offset
        stop = body.find(b"\n", start)
        if stop < 0:  # the last chunk of this message
            self._batches.popleft()
            self._offset = 0
            chunk = body[start:] if start else body
        else:
            self._offset = stop + 1
            chunk = body[start:stop]
        self._took(1)
        return chunk

    def _took(self, count: int) -> None:
        self._taken += count
        self._report_if_due()

    def _report_if_due(self) -> None:
        """Tell the replica how far the consumer has read, once that is ``max(1, window // 2)`` beyond what it was
        told; not once the stream has ended (its handler is done)."""
        if self._taken - self._reported >= max(1, self._window // 2) and self._final is None:
            self._reported = self._taken
            if self.report is not None:
                self.report(self.replica_id, self._taken)

    def _raise_if_failed(self) -> None:
        """At the stream's end: raise the error its final reply stands for, unless it ended well."""
        final = self._final
        assert final is not None
        if final.status is not ReplyStatus.END:
            raise error_of(final)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _waiting(self) -> bool:
        """Whether the consumer waits for chunks (and was not woken yet)."""
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _after_lines(body: bytes, skip: int) -> bytes:
    """``body`` without its first ``skip`` lines."""
    start = 0
    for _ in range(skip):
        start = body.index(b"\n", start) + 1
    return body[start:]
