"""One caller's chunks from one replica: the chunks of all the streams it serves for that caller go to the caller's
reply stream together, as one ChunkBatch entry per round trip.

A language model's tokens come a few at a time from each of many streams: sent one XADD per stream, each chunk
cost the replica a command, Redis an entry and the caller's gateway an entry to parse, and 1,000 such streams took
the whole machine (bench/RESULTS.md, stream bench). Here the streams that have chunks ready go into one entry, at
most STREAM_BATCH_MAX_CHUNKS chunks of each.

One batch per caller is on its way at a time, so every stream's chunks reach Redis in order, whichever batch they
went in and however often one is sent again. The next batch is built once the last one is in Redis, from all that
came meanwhile; a stream's first chunk goes at once when nothing is on its way (what the caller waits for), others
at the end of the loop turn that queued them, or LINGER_S later when many streams share the batcher. A batch Redis
did not take is sent again after a pause; a stream whose deadline passed meanwhile gives up instead
(ChunkSource.undelivered).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Final, Protocol

from streamserve.transport.backoff import Backoff
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import reply_command
from streamserve.wire.messages import ChunkBatch, ChunkPart

logger = logging.getLogger(__name__)

# The most chunks, and (about) the most bytes of them, one stream puts in one batch; a larger chunk goes alone.
STREAM_BATCH_MAX_CHUNKS = 64
STREAM_BATCH_MAX_BYTES = 256 * 1024
# About the most bytes of chunks one batch holds, whatever the streams (a single larger part goes alone).
BATCH_MAX_BYTES = 1024 * 1024
# A batch Redis did not take is sent again at most this far apart.
SEND_RETRY_CAP_S = 1.0
# With this many streams or more for one caller, a batch waits this long for company once one is ready (a
# stream's first chunk never waits). Token streams each have a chunk now and then: sent as soon as it came, most
# batches held one part, and the round trip per part cost the replica, Redis and the caller's gateway most of what
# a chunk cost; waiting a little lets one entry take the chunks of many streams (bench/RESULTS.md, stream bench).
LINGER_MIN_STREAMS = 8
LINGER_S = 0.002


@dataclass(slots=True)
class Taken:
    """A stream's part of a batch, and the chunks in it (queued again should the batch fail)."""

    part: ChunkPart
    chunks: list[bytes]


# What ChunkSource.take answers when its next chunk is larger than the room left in the batch.
DOES_NOT_FIT: Final = "does not fit"


class ChunkSource(Protocol):
    """A stream, as its caller's batcher sees it (workers/streaming.py: Stream)."""

    def take(self, room: int) -> Taken | str | None:
        """Its next part (at most ``room`` bytes, any size when ``room`` is -1: the batch's first) and the chunks in
        it; DOES_NOT_FIT when its next chunk is larger than ``room``; None when it has nothing to send now."""

    def delivered(self, part: ChunkPart) -> None:
        """Redis took ``part``."""

    def undelivered(self, part: ChunkPart, chunks: list[bytes], error: BaseException) -> bool:
        """Redis did not take ``part``: whether to try again (``chunks`` queued first again) or not (given up)."""


class ChunkBatcher:
    """Sends the chunks of the streams one replica serves for one caller (``reply_to``), a batch at a time."""

    def __init__(self, pipeliner: Pipeliner, reply_to: str, replica_id: str) -> None:
        self._pipeliner = pipeliner
        self.reply_to = reply_to
        self._replica_id = replica_id
        self._loop = asyncio.get_running_loop()
        # Streams with chunks to send, in the order they became ready (a dict: ordered, no duplicates).
        self._ready: dict[ChunkSource, None] = {}
        self._flush_due = False
        self._on_its_way: list[tuple[ChunkSource, Taken]] | None = None  # the batch sent and not yet answered
        self._paused = False  # after a failure, until the retry
        self._backoff = Backoff(cap=SEND_RETRY_CAP_S)
        self.streams = 0  # the streams using this batcher (Streams drops it at 0)

    def ready(self, source: ChunkSource, at_once: bool = False) -> None:
        """``source`` has chunks to send: in the next batch, sent now (``at_once``) when no batch is on its way, or
        at the end of this loop turn."""
        self._ready[source] = None
        if self._on_its_way is not None or self._paused:
            return  # it goes when that batch has landed
        if at_once:
            self._flush()
        else:
            self._flush_soon()

    def _flush_soon(self) -> None:
        """Flush at the end of this loop turn, or after LINGER_S when many streams share this batcher."""
        if self._flush_due:
            return
        self._flush_due = True
        if self.streams >= LINGER_MIN_STREAMS:
            self._loop.call_later(LINGER_S, self._flush_when_due)
        else:
            self._loop.call_soon(self._flush_when_due)

    def _flush_when_due(self) -> None:
        self._flush_due = False
        self._flush()

    def _flush(self) -> None:
        if self._on_its_way is not None or self._paused or not self._ready:
            return
        taken: list[tuple[ChunkSource, Taken]] = []
        room = BATCH_MAX_BYTES
        for source in list(self._ready):
            got = source.take(room if taken else -1)
            if got is DOES_NOT_FIT:
                continue  # it stays ready, for the next batch
            del self._ready[source]
            if isinstance(got, Taken):
                taken.append((source, got))
                room -= len(got.part.body)
                if room <= 0:
                    break
            # (None: it has nothing to send now; it says so again when it has)
        if not taken:
            return
        self._on_its_way = taken
        batch = ChunkBatch(self._replica_id, [t.part for _, t in taken])
        sent = self._pipeliner.execute(reply_command(self.reply_to, batch))
        sent.add_done_callback(self._landed)

    def _landed(self, sent: asyncio.Future[list[Any]]) -> None:
        taken, self._on_its_way = self._on_its_way or [], None
        error: BaseException | None = asyncio.CancelledError() if sent.cancelled() else sent.exception()
        if error is None and isinstance(result := sent.result()[0], Exception):
            error = result  # Redis refused it (out of memory, say)
        if error is None:
            self._backoff.reset()
            for source, t in taken:
                source.delivered(t.part)  # (those with more queued are ready again)
            if self._ready:
                self._flush_soon()
            return
        retried = [source for source, t in taken if source.undelivered(t.part, t.chunks, error)]
        if not retried and not self._ready:
            return
        self._ready = {**dict.fromkeys(retried), **self._ready}  # the failed ones first
        delay = self._backoff.next()
        logger.warning(
            "replica %s: sending chunks of %d stream(s) to %s failed: %s; again in %.1fs",
            self._replica_id,
            len(retried),
            self.reply_to,
            error,
            delay,
        )
        self._paused = True
        self._loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        self._paused = False
        self._flush()
