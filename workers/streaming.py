"""Streaming handlers in the replica: run a generator, send what it yields to its caller, pause it while the caller
lags behind.

One streaming request is one Stream. Its chunks go onto the caller's reply
stream in ChunkBatch entries (wire/messages.py), together with the chunks of
the replica's other streams for the same caller that are ready at the same
time: the caller's ChunkBatcher (workers/chunk_batches.py) sends them, one
batch on its way at a time, so each stream's chunks reach Redis in order. The
final reply (END, or the error) comes last, handed to the replica's Finisher
once every chunk is in Redis so that the request's XACK and XDEL go with it.

An async generator is iterated by a task on the loop. A sync one runs, the
whole of it, on one handler thread, which hands chunks to the loop (one wake-up
for all those the loop has not taken yet) and blocks while the stream is
paused. Either way the generator is kept at most ``max_unread_chunks`` chunks
ahead of what its caller says it has read (ReadProgress, on the replica's
control stream: workers/control_reader.py), and it is closed once the
request's deadline passes or the request is cancelled: an async one at once
(cancelled where it waits, then ``aclose()``, which raises GeneratorExit at the
``yield`` where it is paused), a sync one at its next ``yield``. A cancelled
stream sends nothing more: its chunks not yet sent are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from streamserve.metrics.definitions import CANCELLED, RUNNING_STAGE, STREAM_CHUNKS, TIME_TO_FIRST_CHUNK
from streamserve.metrics.figures import Figures
from streamserve.runtime.request_scope import RequestScope
from streamserve.runtime.trace_context import chunks_sent
from streamserve.transport.pipelining import Pipeliner
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import ResponseTooLargeError
from streamserve.wire.json_values import dumps
from streamserve.wire.messages import READ_ALL, ChunkPart, Fields, ReadProgress, Reply, ReplyStatus, Request, now_ms
from streamserve.workers.chunk_batches import (
    DOES_NOT_FIT,
    STREAM_BATCH_MAX_BYTES,
    STREAM_BATCH_MAX_CHUNKS,
    ChunkBatcher,
    Taken,
)
from streamserve.workers.contained import HandlerExit
from streamserve.workers.control_reader import ControlHandler
from streamserve.workers.loader import Handler
from streamserve.workers.threads import HandlerThreads

logger = logging.getLogger(__name__)


# Serving's reply to a request whose handler raised (logged there): (request, exception, message prefix).
UserError = Callable[[Request, BaseException, str], Reply]


@dataclass(slots=True)
class _Ending:
    """How a generator stopped, as the side that ran it tells."""

    # It raised, or a chunk it yielded could not be sent.
    error: BaseException | None = None
    # What the error's message starts with, e.g. "chunk 3 cannot be sent as JSON: ".
    context: str = ""
    # It was closed from outside before it ended (its deadline passed).
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class _Replica:
    """What every stream of one replica shares."""

    threads: HandlerThreads
    replica_id: str
    deployment: str
    figures: Figures | None
    user_error: UserError


class Stream:
    """One streaming request, from its generator's start to its final reply (``outcome``)."""

    def __init__(
        self,
        request: Request,
        replica: _Replica,
        batcher: ChunkBatcher,
        window: int,
        max_chunk_bytes: int,
        scope: RequestScope,
    ) -> None:
        self._request = request
        self._scope = scope
        self._replica = replica
        self._batcher = batcher
        self.window = window
        self._max_chunk_bytes = max_chunk_bytes
        self._loop = asyncio.get_running_loop()
        self._started_at = time.perf_counter()
        # The final reply (END or an error, with ``seq`` the chunks sent); cancelled when the replica closes it.
        self.outcome: asyncio.Future[Reply] = self._loop.create_future()
        # -- the generator's side (a sync generator's thread shares these under _lock) --
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a paused sync generator's thread waits on it
        self._async_room: asyncio.Event | None = None  # a paused async generator's task waits on it
        self._produced = 0  # chunks taken from the generator, encoded and handed over
        self._read = 0  # how many its caller last said it has read
        self._stop = False  # close the generator: its deadline passed, it was cancelled, or the replica closes it
        self._cancelled = False
        self._handoff: list[bytes] = []  # a sync generator's chunks the loop has not taken yet
        self._handoff_due = False
        self._task: asyncio.Task[_Ending] | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_passed = False
        # -- the sending side (the loop only) --
        self._queue: list[bytes] = []
        self._in_flight = False  # a part of it is in the batch on its way (or waits to be sent again)
        self._sent = 0  # chunks in the parts taken so far: the next part's seq
        self._delivered = 0  # chunks Redis has taken
        self._undeliverable = False  # Redis took none of them until the deadline passed: given up
        self._ending: _Ending | None = None
        # A stream with an idempotency key keeps what Redis took, for the retries (``kept_reply``); None once more
        # than max_response_bytes (then its size is in _kept_bytes).
        self._kept: list[bytes] | None = [] if request.idem else None
        self._kept_bytes = 0

    # -- starting and stopping ---------------------------------------------------

    def start(self, handler: Handler, body: Any) -> None:
        """Start the generator: an async one in a task on the loop, a sync one on a handler thread."""
        producing: asyncio.Future[_Ending]
        context = self._scope.context()  # streamserve.cancelled() and handles see the request in the generator
        if handler.is_async:
            self._async_room = asyncio.Event()
            producing = self._task = self._loop.create_task(self._iterate_async(handler.fn, body), context=context)
        else:
            iterate = functools.partial(self._iterate_sync, handler.fn)
            producing = self._replica.threads.run(functools.partial(context.run, iterate), body)
        producing.add_done_callback(self._producer_done)
        self._scope.stop = self.cancel
        deadline_ms = self._request.deadline_ms
        if deadline_ms:
            self._deadline_timer = self._loop.call_later(max(0.0, (deadline_ms - now_ms()) / 1000), self._on_deadline)

    def cancel(self) -> None:
        """The request was cancelled: close the generator, send nothing more, end with a CANCELLED outcome."""
        if self._ending is not None and not self._queue:
            return  # it has ended, its final reply on its way
        # Past its deadline the cancel is its caller giving up for that reason (the gateway's 504): a sync generator
        # stops only at its next yield, and the cancel comes first; the deadline is what stopped it.
        self._cancelled = not self._deadline_passed
        self._queue.clear()
        self._stop_generator()
        if self._ending is not None:
            self._progress()

    def close(self) -> None:
        """Stop it without a reply (the replica exits past its drain's grace period): its entry stays pending."""
        self.outcome.cancel()
        self._stop_generator()

    def forget(self) -> None:
        """It has its outcome: drop its deadline timer."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    def caller_read(self, read: int) -> None:
        """Its caller has taken ``read`` chunks: the generator may run up to ``window`` chunks beyond."""
        if read <= self._read:
            return
        with self._lock:
            self._read = read
            self._room.notify_all()
        if self._async_room is not None:
            self._async_room.set()

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        if self._ending is None and not self._cancelled:
            self._deadline_passed = True
            self._stop_generator()

    def _stop_generator(self) -> None:
        with self._lock:
            self._stop = True
            self._room.notify_all()
        if self._task is not None:
            self._task.cancel()

    # -- the generator's side --------------------------------------------------

    def _encode(self, chunk: Any) -> bytes | _Ending:
        """The chunk as compact JSON, or the ending it makes when it cannot be sent."""
        index = self._produced
        try:
            encoded = dumps(chunk)
        except Exception as exc:  # no exact JSON form
            return _Ending(exc, f"chunk {index} cannot be sent as JSON: ")
        if len(encoded) > self._max_chunk_bytes:
            return _Ending(
                ResponseTooLargeError(
                    f"chunk {index} is {len(encoded)} bytes of JSON, above max_response_bytes ({self._max_chunk_bytes})"
                )
            )
        return encoded

    def _iterate_sync(self, fn: Callable[[Any], Iterator[Any]], body: Any) -> _Ending:
        """On a handler thread: the whole iteration of a sync generator."""
        try:
            chunks = iter(fn(body))
        except Exception as exc:
            return _Ending(exc)
        try:
            while self._room_or_stop():
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return _Ending()
                except Exception as exc:
                    return _Ending(exc)
                encoded = self._encode(chunk)
                if isinstance(encoded, _Ending):
                    return encoded
                self._hand_over(encoded)
            return _Ending(stopped=True)
        finally:
            self._close_quietly(chunks)

    def _room_or_stop(self) -> bool:
        """On the thread: wait while the caller is ``window`` chunks behind; False once the generator must stop."""
        with self._lock:
            paused = False
            while not self._stop and self._produced - self._read >= self.window:
                if not paused:
                    paused = True
                    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing reads on
                        self._loop.call_soon_threadsafe(self._reader_waits, True)
                self._room.wait()
            if paused:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._reader_waits, False)
            return not self._stop

    def _reader_waits(self, paused: bool) -> None:
        """On the loop: the generator is paused until its caller reads on (which may not come for long), or goes on
        (RequestScope.reader_waits)."""
        scope = self._scope
        scope.reader_waits = paused
        if paused and scope.on_reader_wait is not None:
            scope.on_reader_wait()

    def _hand_over(self, encoded: bytes) -> None:
        """On the thread: give a chunk to the loop, waking it unless a wake-up is already due."""
        with self._lock:
            self._produced += 1
            self._handoff.append(encoded)
            if self._handoff_due:
                return
            self._handoff_due = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody sends them any more
            self._loop.call_soon_threadsafe(self._take_handoff)

    def _close_quietly(self, chunks: Iterator[Any]) -> None:
        """Close a sync generator (its ``finally`` runs; nothing happens to one that has ended)."""
        close = getattr(chunks, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception as exc:
            logger.warning("replica %s: closing request %s's generator raised: %r", self._who, self._rid, exc)

    async def _iterate_async(self, fn: Callable[[Any], AsyncIterator[Any]], body: Any) -> _Ending:
        """In a task on the loop: the whole iteration of an async generator."""
        room = self._async_room
        assert room is not None
        try:
            chunks = fn(body)
        except Exception as exc:
            return _Ending(exc)
        try:
            while not self._stop:
                if self._produced - self._read >= self.window:
                    self._reader_waits(True)
                    while self._produced - self._read >= self.window:
                        room.clear()
                        await room.wait()
                    self._reader_waits(False)
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return _Ending()
                encoded = self._encode(chunk)
                if isinstance(encoded, _Ending):
                    return encoded
                self._produced += 1
                self._queue.append(encoded)
                self._progress()
                if self._produced == 1 or self._produced % STREAM_BATCH_MAX_CHUNKS == 0:
                    # A generator that never waits: let these chunks go meanwhile. The first at once (its send is a
                    # task that needs the loop): it is what the caller waits for, and without this turn it left
                    # only after the window's 64 chunks were made (+0.8 ms to the first chunk of a long stream).
                    await asyncio.sleep(0)
            return _Ending(stopped=True)
        except asyncio.CancelledError as exc:
            if self._deadline_passed or self._cancelled:
                return _Ending(stopped=True)
            if (task := asyncio.current_task()) is not None and task.cancelling():
                raise  # the replica closes it: no reply
            return _Ending(HandlerExit(exc))  # the generator's own: its error, as a handler's (workers/contained.py)
        except Exception as exc:
            return _Ending(stopped=True) if self._deadline_passed or self._cancelled else _Ending(exc)
        except BaseException as exc:  # SystemExit and the like: the stream's error, never the event loop's
            return _Ending(exc)
        finally:
            await self._aclose_quietly(chunks)

    async def _aclose_quietly(self, chunks: AsyncIterator[Any]) -> None:
        aclose = getattr(chunks, "aclose", None)
        if aclose is None:
            return
        try:
            await aclose()
        except Exception as exc:
            logger.warning("replica %s: closing request %s's generator raised: %r", self._who, self._rid, exc)

    def _producer_done(self, done: asyncio.Future[_Ending]) -> None:
        """The generator has stopped: its final reply goes once the chunks before it are in Redis."""
        if done.cancelled():
            if self._cancelled or self._deadline_passed:  # cancelled before the generator took its first step
                self._ending = _Ending(stopped=True)
                self._take_handoff()
                return
            self.outcome.cancel()  # its thread's job was dropped, or the replica closed it: no reply
            return
        exc = done.exception()
        self._ending = _Ending(exc) if exc is not None else done.result()
        self._take_handoff()

    # -- the sending side (the loop only) ---------------------------------------------

    def _take_handoff(self) -> None:
        with self._lock:
            chunks, self._handoff = self._handoff, []
            self._handoff_due = False
        self._queue += chunks
        self._progress()

    def _progress(self, at_once: bool = False) -> None:
        """Hand what is queued to the batcher (``at_once``: sent now if nothing is on its way), unless part of this
        stream is on its way already (the rest goes once it has landed); settle the outcome once all of it has."""
        if self._in_flight or self.outcome.done():
            return
        if self._undeliverable or self._cancelled:
            self._queue.clear()
        elif self._unread and self._queue:
            self._drop_unread()
        if self._queue:
            self._batcher.ready(self, at_once or self._sent == 0)  # the first chunk is what the caller waits for
        else:
            self._finish_if_ended()

    def _drop_unread(self) -> None:
        """A stream nobody reads: its chunks count as delivered at once (kept, for an idempotency key's retries)."""
        chunks, self._queue = self._queue, []
        if self._request.idem:
            self._keep(b"\n".join(chunks))
        self._delivered += len(chunks)

    def take(self, room: int) -> Taken | str | None:
        """The batcher's: this stream's next part (chunk_batches.ChunkSource)."""
        if self._in_flight or self.outcome.done() or self._undeliverable or self._cancelled or not self._queue:
            return None
        size = count = 0
        limit = STREAM_BATCH_MAX_BYTES if room < 0 else min(room, STREAM_BATCH_MAX_BYTES)
        for chunk in self._queue:
            if count == STREAM_BATCH_MAX_CHUNKS or (size + len(chunk) > limit and (count or room >= 0)):
                break
            size += len(chunk) + 1
            count += 1
        if count == 0:
            return DOES_NOT_FIT
        chunks = self._queue[:count]
        del self._queue[:count]
        if self._sent == 0 and self._replica.figures is not None:
            elapsed = time.perf_counter() - self._started_at
            self._replica.figures.observe(self._replica.deployment, TIME_TO_FIRST_CHUNK, elapsed)
        part = ChunkPart(self._rid, self._request.tag, self._sent, count, self.window, b"\n".join(chunks))
        self._sent += count
        self._in_flight = True
        return Taken(part, chunks)

    def delivered(self, part: ChunkPart) -> None:
        """The batcher's: Redis took ``part``."""
        self._in_flight = False
        self._delivered = part.seq + part.count
        if self._request.idem:
            self._keep(part.body)
        if self._replica.figures is not None:
            self._replica.figures.count(self._replica.deployment, STREAM_CHUNKS, "", part.count)
        if self._scope.trace is not None:
            chunks_sent(self._scope.trace, part.seq, part.count)
        self._progress()

    def _keep(self, body: bytes) -> None:
        self._kept_bytes += len(body) + 1
        if self._kept is not None:
            if self._kept_bytes > self._max_chunk_bytes:
                self._kept = None  # too large to keep: its retries are told so
            else:
                self._kept.append(body)

    def kept_reply(self, final: Reply) -> Reply | None:
        """What a stream with an idempotency key keeps for its retries, once it ended with ``final``: ``final`` with
        the chunks Redis took as its body (joined by b"\n"), or a ResponseTooLargeError when they are above
        max_response_bytes. None for a stream without a key."""
        if not self._request.idem:
            return None
        if self._kept is None:
            size, limit = self._kept_bytes, self._max_chunk_bytes
            return self._request.reply(
                ReplyStatus.USER_ERROR,
                self._who,
                error_type=ResponseTooLargeError.__name__,
                error_message=f"the stream's chunks are {size} bytes of JSON, above max_response_bytes ({limit})",
            )
        return replace(final, body=b"\n".join(self._kept))

    def undelivered(self, part: ChunkPart, chunks: list[bytes], error: BaseException) -> bool:
        """The batcher's: Redis did not take ``part``. Queue its chunks again, or give up once the deadline passed."""
        self._in_flight = False
        if self.outcome.done() or self._cancelled:
            self._progress()
            return False
        deadline_ms = self._request.deadline_ms
        if deadline_ms and now_ms() >= deadline_ms:
            logger.warning(
                "replica %s: request %s: Redis took none of chunks %d on before the deadline passed (%s): stream ended",
                self._who,
                self._rid,
                part.seq,
                error,
            )
            self._undeliverable = True
            self._deadline_passed = True
            self._stop_generator()
            self._progress()
            return False
        self._queue[:0] = chunks
        self._sent = part.seq
        return True

    def _finish_if_ended(self) -> None:
        """Settle ``outcome`` once the generator has stopped (``_progress`` calls it once every chunk is in Redis)."""
        ending = self._ending
        if ending is None:
            return
        if self._cancelled:
            reply = self._request.reply(ReplyStatus.CANCELLED, self._who, error_message=RUNNING_STAGE)
        elif self._undeliverable or (self._deadline_passed and (ending.stopped or ending.error is None)):
            # Stopped at its deadline, or a sync generator that saw streamserve.cancelled() there and returned: its
            # chunks end short of what it would have made (a retry with its key runs it anew), and its caller has
            # its 504 already.
            reply = self._request.reply(ReplyStatus.DEADLINE_EXCEEDED, self._who)
            if self._replica.figures is not None:  # its deadline stopped it: a cancellation while it ran
                self._replica.figures.count(self._replica.deployment, CANCELLED, RUNNING_STAGE)
        elif ending.error is not None:
            reply = self._replica.user_error(self._request, ending.error, ending.context)
        else:
            reply = self._request.reply(ReplyStatus.END, self._who)
        reply.seq = self._delivered
        self.outcome.set_result(reply)

    @property
    def key(self) -> tuple[str, str]:
        """Its request id and tag: what names it in its caller's ReadProgress messages."""
        return self._request.request_id, self._request.tag

    @property
    def batcher(self) -> ChunkBatcher:
        return self._batcher

    @property
    def _unread(self) -> bool:
        """Nobody reads its chunks (send(), a shadow copy: no reply stream): they are dropped as they come."""
        return not self._request.reply_to

    @property
    def _rid(self) -> str:
        return self._request.request_id

    @property
    def _who(self) -> str:
        return self._replica.replica_id


class Streams:
    """The streaming requests one replica serves, by request id and tag (as its control messages name them)."""

    def __init__(
        self,
        *,
        pipeliner: Pipeliner,
        threads: HandlerThreads,
        replica_id: str,
        deployment: str,
        figures: Figures | None,
        user_error: UserError,
    ) -> None:
        self._replica = _Replica(threads, replica_id, deployment, figures, user_error)
        self._pipeliner = pipeliner
        # By request id and tag (Request.tag), as ReadProgress names them: streams may share a request id.
        self._running: dict[tuple[str, str], Stream] = {}
        self._batchers: dict[str, ChunkBatcher] = {}  # by reply stream: one per caller with streams here

    def start(
        self, request: Request, handler: Handler, body: Any, config: DeploymentConfig, scope: RequestScope
    ) -> Stream:
        """Run ``handler`` (a generator function) on ``body``; the stream's ``outcome`` holds its final reply.
        Cancelling ``scope`` stops it."""
        batcher = self._batchers.get(request.reply_to)
        if batcher is None:
            batcher = self._batchers[request.reply_to] = ChunkBatcher(
                self._pipeliner, request.reply_to, self._replica.replica_id
            )
        batcher.streams += 1
        window = config.max_unread_chunks if request.reply_to else READ_ALL  # (nobody reads: none is awaited)
        stream = Stream(request, self._replica, batcher, window, config.max_response_bytes, scope)
        stream.start(handler, body)
        self._running[stream.key] = stream
        stream.outcome.add_done_callback(functools.partial(self._ended, stream))
        return stream

    def _ended(self, stream: Stream, _outcome: asyncio.Future[Reply]) -> None:
        stream.forget()
        if self._running.get(stream.key) is stream:
            del self._running[stream.key]
        batcher = stream.batcher
        batcher.streams -= 1
        if batcher.streams == 0 and self._batchers.get(batcher.reply_to) is batcher:
            del self._batchers[batcher.reply_to]

    @property
    def control_handlers(self) -> dict[bytes, ControlHandler]:
        """What this side of the replica does with control messages, by their ``kind``."""
        return {b"read": self._caller_read}

    def _caller_read(self, fields: Fields) -> None:
        progress = ReadProgress.decode(fields)
        stream = self._running.get((progress.request_id, progress.tag))
        if stream is not None:  # else it has ended (or was never here)
            stream.caller_read(progress.read)

    def close(self) -> None:
        """Stop every stream without a reply: their entries stay pending, to be served again elsewhere."""
        for stream in list(self._running.values()):
            stream.close()
