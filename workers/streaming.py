"""Streaming handlers in the replica: run a generator, send what it yields to its caller, pause it while the caller
lags behind.

One streaming request is one Stream. Its chunks go onto the caller's reply
stream as CHUNK replies (wire/messages.py). The chunks yielded within one
event-loop turn, or while the stream's previous reply is on its way, go
together in one XADD (at most STREAM_BATCH_MAX_CHUNKS chunks or
STREAM_BATCH_MAX_BYTES bytes). One XADD per stream is on its way at a time, so
its replies reach Redis in order whatever connection each goes on and however
often one is sent again; the final reply (END, or the error) comes last, handed
to the replica's Finisher once every chunk is in Redis so that the request's
XACK and XDEL go with it.

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
from dataclasses import dataclass
from typing import Any

from streamserve.metrics.definitions import RUNNING_STAGE, STREAM_CHUNKS, TIME_TO_FIRST_CHUNK
from streamserve.metrics.figures import Figures
from streamserve.runtime.request_scope import RequestScope
from streamserve.transport.backoff import Backoff
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import reply_command
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import ResponseTooLargeError
from streamserve.wire.json_values import dumps
from streamserve.wire.messages import Fields, ReadProgress, Reply, ReplyStatus, Request, now_ms
from streamserve.workers.control_reader import ControlHandler
from streamserve.workers.loader import Handler
from streamserve.workers.threads import HandlerThreads

logger = logging.getLogger(__name__)

# The most chunks, and (about) the most bytes of them, one CHUNK reply carries; a larger chunk goes alone.
STREAM_BATCH_MAX_CHUNKS = 64
STREAM_BATCH_MAX_BYTES = 256 * 1024
# A CHUNK reply Redis did not take is sent again at most this far apart, until the request's deadline.
SEND_RETRY_CAP_S = 1.0

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

    pipeliner: Pipeliner
    threads: HandlerThreads
    replica_id: str
    deployment: str
    figures: Figures | None
    user_error: UserError


class Stream:
    """One streaming request, from its generator's start to its final reply (``outcome``)."""

    def __init__(
        self, request: Request, replica: _Replica, window: int, max_chunk_bytes: int, scope: RequestScope
    ) -> None:
        self._request = request
        self._scope = scope
        self._replica = replica
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
        self._send_due = False
        self._in_flight = False  # a CHUNK reply is on its way (or waits to be sent again)
        self._sent = 0  # chunks in the replies issued so far: the next reply's seq
        self._delivered = 0  # chunks Redis has taken
        self._undeliverable = False  # Redis took none of them until the deadline passed: given up
        self._backoff = Backoff(cap=SEND_RETRY_CAP_S)
        self._ending: _Ending | None = None

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
        self._cancelled = True
        self._queue.clear()
        self._stop_generator()
        if self._ending is not None:
            self._send()

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
        if self._ending is None:
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
            while not self._stop and self._produced - self._read >= self.window:
                self._room.wait()
            return not self._stop

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
                while self._produced - self._read >= self.window:
                    room.clear()
                    await room.wait()
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return _Ending()
                encoded = self._encode(chunk)
                if isinstance(encoded, _Ending):
                    return encoded
                self._produced += 1
                self._queue.append(encoded)
                if self._produced == 1:
                    self._send()  # the first chunk at once, not at the end of the turn: it is what the caller awaits
                else:
                    self._send_soon()
                if self._produced % STREAM_BATCH_MAX_CHUNKS == 0:
                    await asyncio.sleep(0)  # a generator that never waits: let these chunks go meanwhile
            return _Ending(stopped=True)
        except asyncio.CancelledError:
            if self._deadline_passed or self._cancelled:
                return _Ending(stopped=True)
            raise  # the replica closes it: no reply
        except Exception as exc:
            return _Ending(stopped=True) if self._deadline_passed or self._cancelled else _Ending(exc)
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
        if done.cancelled():  # its thread's job was dropped, or the replica closed it
            self.outcome.cancel()
            return
        exc = done.exception()
        self._ending = _Ending(exc) if exc is not None else done.result()
        self._take_handoff()

    # -- the sending side ---------------------------------------------------------

    def _take_handoff(self) -> None:
        with self._lock:
            chunks, self._handoff = self._handoff, []
            self._handoff_due = False
        self._queue += chunks
        self._send()

    def _send_soon(self) -> None:
        """Send at the end of this loop turn, with whatever else the generator yields in it."""
        if not self._send_due:
            self._send_due = True
            self._loop.call_soon(self._send_now)

    def _send_now(self) -> None:
        self._send_due = False
        self._send()

    def _send(self) -> None:
        """Send what is queued as one CHUNK reply, unless one is on its way (the rest go when it has arrived); the
        final reply once all of them have."""
        if self._in_flight or self.outcome.done():
            return
        if self._undeliverable or self._cancelled:
            self._queue.clear()
        if not self._queue:
            self._finish_if_ended()
            return
        size = count = 0
        for chunk in self._queue:
            if count == STREAM_BATCH_MAX_CHUNKS or (count and size + len(chunk) > STREAM_BATCH_MAX_BYTES):
                break
            size += len(chunk) + 1
            count += 1
        batch = self._queue[:count]
        del self._queue[:count]
        reply = Reply(
            self._rid,
            ReplyStatus.CHUNK,
            self._who,
            body=b"\n".join(batch),
            seq=self._sent,
            count=count,
            window=self.window,
        )
        if self._sent == 0 and self._replica.figures is not None:
            elapsed = time.perf_counter() - self._started_at
            self._replica.figures.observe(self._replica.deployment, TIME_TO_FIRST_CHUNK, elapsed)
        self._sent += count
        self._issue(reply)

    def _issue(self, reply: Reply) -> None:
        if self.outcome.done():
            return  # closed meanwhile
        self._in_flight = True
        sent = self._replica.pipeliner.execute(reply_command(self._request.reply_to, reply))
        sent.add_done_callback(functools.partial(self._issued, reply))

    def _issued(self, reply: Reply, sent: asyncio.Future[list[Any]]) -> None:
        self._in_flight = False
        if self.outcome.done():
            return
        error: BaseException | None = asyncio.CancelledError() if sent.cancelled() else sent.exception()
        if error is None and isinstance(result := sent.result()[0], Exception):
            error = result  # Redis refused it (out of memory, say)
        if error is not None:
            self._failed(reply, error)
            return
        self._backoff.reset()
        self._delivered = reply.seq + reply.count
        if self._replica.figures is not None:
            self._replica.figures.count(self._replica.deployment, STREAM_CHUNKS, "", reply.count)
        self._send()

    def _failed(self, reply: Reply, error: BaseException) -> None:
        """Send ``reply`` again after a pause, or give up on the stream once its deadline has passed."""
        deadline_ms = self._request.deadline_ms
        if deadline_ms and now_ms() >= deadline_ms:
            logger.warning(
                "replica %s: request %s: Redis took none of chunks %d on before the deadline passed (%s): stream ended",
                self._who,
                self._rid,
                reply.seq,
                error,
            )
            self._undeliverable = True
            self._deadline_passed = True
            self._stop_generator()
            self._send()
            return
        delay = self._backoff.next()
        logger.warning(
            "replica %s: request %s: sending chunks %d-%d failed: %s; again in %.1fs",
            self._who,
            self._rid,
            reply.seq,
            reply.seq + reply.count - 1,
            error,
            delay,
        )
        self._in_flight = True
        self._loop.call_later(delay, self._issue, reply)

    def _finish_if_ended(self) -> None:
        """Settle ``outcome`` once the generator has stopped (``_send`` calls it once every chunk is in Redis)."""
        ending = self._ending
        if ending is None:
            return
        if self._cancelled:
            reply = Reply(self._rid, ReplyStatus.CANCELLED, self._who, error_message=RUNNING_STAGE)
        elif self._undeliverable or (ending.stopped and self._deadline_passed):
            reply = Reply(self._rid, ReplyStatus.DEADLINE_EXCEEDED, self._who)
        elif ending.error is not None:
            reply = self._replica.user_error(self._request, ending.error, ending.context)
        else:
            reply = Reply(self._rid, ReplyStatus.END, self._who)
        reply.seq = self._delivered
        self.outcome.set_result(reply)

    @property
    def request_id(self) -> str:
        return self._request.request_id

    @property
    def _rid(self) -> str:
        return self._request.request_id

    @property
    def _who(self) -> str:
        return self._replica.replica_id


class Streams:
    """The streaming requests one replica serves, by request id (as its control messages name them)."""

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
        self._replica = _Replica(pipeliner, threads, replica_id, deployment, figures, user_error)
        self._running: dict[str, Stream] = {}

    def start(
        self, request: Request, handler: Handler, body: Any, config: DeploymentConfig, scope: RequestScope
    ) -> asyncio.Future[Reply]:
        """Run ``handler`` (a generator function) on ``body``; the future holds its final reply. Cancelling ``scope``
        stops it."""
        stream = Stream(request, self._replica, config.max_unread_chunks, config.max_response_bytes, scope)
        stream.start(handler, body)
        self._running[request.request_id] = stream
        stream.outcome.add_done_callback(functools.partial(self._ended, stream))
        return stream.outcome

    def _ended(self, stream: Stream, _outcome: asyncio.Future[Reply]) -> None:
        stream.forget()
        if self._running.get(stream.request_id) is stream:
            del self._running[stream.request_id]

    @property
    def control_handlers(self) -> dict[bytes, ControlHandler]:
        """What this side of the replica does with control messages, by their ``kind``."""
        return {b"read": self._caller_read}

    def _caller_read(self, fields: Fields) -> None:
        progress = ReadProgress.decode(fields)
        stream = self._running.get(progress.request_id)
        if stream is not None:  # else it has ended (or was never here)
            stream.caller_read(progress.read)

    def close(self) -> None:
        """Stop every stream without a reply: their entries stay pending, to be served again elsewhere."""
        for stream in list(self._running.values()):
            stream.close()
