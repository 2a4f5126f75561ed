"""A caller's reply stream: one per client process, one reader task that resolves every in-flight request.

Bound and owner: replicas add replies with an approximate MAXLEN
(``streams.reply_command``) and NOMKSTREAM, so a dead caller's expired stream
is never recreated; this class keeps the stream's expiry fresh while the
caller lives, and trims what it has read about once a second: the XTRIM rides
in the same write as the next XREAD, so it costs no round trip of its own.

When Redis goes away, requests already sent cannot be answered: their replies
would be written to Redis. After ``REPLY_OUTAGE_FAIL_S`` without Redis every
caller still waiting gets RedisUnavailableError instead of waiting out its
deadline; if Redis is back sooner, the reader reads on from where it was.

Calls are found by their tag (Request.tag), not their request id: the tag is
this reader's own count, never used twice, so a reply reaches the call it
answers even when another call, now or earlier, had the same request id (a
caller that reconnects with its id, say); a reply for a call that is gone is
dropped. A reply with no tag (from a replica of an earlier release) is
matched by its request id.

Streams: a request's first reply resolves its future, as for any request. When
that reply is chunks (a part of a ChunkBatch entry: one entry holds the chunks
of every stream a replica had ready for this caller), the request becomes a
stream: the rest of its replies go to its ``ChunkFeed`` (``feed``), opened
right then by the reader, so that no reply that came in the same read is
lost. A unary reply costs one check more than before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from streamserve.client.chunk_feed import ChunkFeed
from streamserve.transport.background_tasks import background_task
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS, RedisRefusals, refuses_writes, retrying_stopped
from streamserve.transport.pipelining import BlockingReader, Command
from streamserve.wire.errors import ProtocolError, RedisUnavailableError, StreamServeError
from streamserve.wire.messages import ChunkBatch, Fields, Reply, ReplyStatus

logger = logging.getLogger(__name__)

REPLY_STREAM_TTL_S = 60  # a caller's reply stream expires this long after its caller stops refreshing it (it died)
# The most replies one read takes. A reply costs the reader one loop turn's share of its wake-ups, so the reads a
# second are bounded by how long a turn takes: a gateway relaying 1,000 token streams (50,000 chunks a second) fell
# ever further behind at 1,000 a read, and keeps up with a 10,000 ceiling (bench/RESULTS.md, stream bench).
REPLY_READ_COUNT = 10_000
REPLY_BLOCK_MS = 1000
# Read replies are trimmed at most this often (one XTRIM per interval, however many replies).
REPLY_TRIM_INTERVAL_S = 1.0
# Callers still waiting when the reader has been cut from Redis this long get RedisUnavailableError.
REPLY_OUTAGE_FAIL_S = 3.0
# The reader retries Redis at most this far apart, so it is back within a second of Redis.
_RETRY_CAP_S = 1.0
_READ_REPLIES = ("XREAD", "COUNT", REPLY_READ_COUNT, "BLOCK", REPLY_BLOCK_MS, "STREAMS")
_READER_TASK = "streamserve-replies"


def _what_becomes_of_it() -> str:
    """What a caller whose reply Redis's outage cut off is told becomes of its request: cancelled once Redis is
    back, by this process; unless its `streamserve up` is gone (killed -9, its Redis with it), which ends this
    process too, before it can cancel anything: the request then runs when the farm is back."""
    if retrying_stopped():
        return (
            "the `streamserve up` of this farm is gone, and the request cannot be cancelled: it may run when the "
            "farm is back (send again only what may run twice, or use an Idempotency-Key)"
        )
    return "the request is cancelled once Redis is back (if it ran before, its answer is lost)"


class ReplyStream:
    """Creates, reads, trims and finally deletes one caller's reply stream."""

    def __init__(self, redis: aioredis.Redis, name: str, caller_id: str, refusals: RedisRefusals) -> None:
        self._redis = redis
        self.name = name
        self._caller_id = caller_id
        self._refusals = refusals
        # Calls waiting for their (first) reply, by tag.
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        # Streams past their first reply, by tag, until their consumer closes them.
        self._feeds: dict[str, ChunkFeed] = {}
        self._tags = itertools.count(1)
        # The tag of the latest call of each request id waiting here: for replies that carry no tag.
        self._tag_of: dict[str, str] = {}
        # Feeds given chunks in this read whose consumers write them at once (ChunkFeed.flush), once it is all in.
        self._to_flush: list[ChunkFeed] = []
        self._last_id = b"0-0"
        self._trimmed_to = b"0-0"
        self._trim_due = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    async def create(self) -> None:
        """Make the stream (a first entry) with its expiry; reads start after that entry."""
        entry_id = await self._redis.xadd(self.name, {"hello": self._caller_id})
        await self._redis.expire(self.name, REPLY_STREAM_TTL_S)
        self._last_id = entry_id if isinstance(entry_id, bytes) else entry_id.encode()

    def start(self) -> None:
        """Start the reader and the upkeep tasks (transport/background_tasks.py: in a context of their own)."""
        self._tasks = [
            background_task(self._read(), _READER_TASK),
            background_task(self._keep(), "streamserve-reply-keeper"),
        ]

    def new_tag(self) -> str:
        """A tag for a call (Request.tag) that no other call of this reader ever had."""
        return format(next(self._tags), "x")

    def expect(self, tag: str, request_id: str) -> asyncio.Future[Reply]:
        """A future that the reply to the call ``tag`` (of request ``request_id``) resolves; ``forget`` it once done
        with it."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[tag] = fut
        self._tag_of[request_id] = tag
        return fut

    def waits_for(self, tag: str) -> bool:
        """Whether a caller still waits for the reply to call ``tag`` (not answered, failed or forgotten)."""
        fut = self._pending.get(tag)
        return fut is not None and not fut.done()

    def forget(self, tag: str, request_id: str) -> None:
        """Its caller is done with the call's future (a stream's feed stays, until ``forget_feed``)."""
        self._pending.pop(tag, None)
        if self._tag_of.get(request_id) == tag and tag not in self._feeds:
            del self._tag_of[request_id]

    def feed(self, tag: str) -> ChunkFeed | None:
        """The stream call ``tag`` turned into with its first reply (chunks), until ``forget_feed``."""
        return self._feeds.get(tag)

    def forget_feed(self, tag: str, request_id: str) -> None:
        """Its consumer is done with the stream: its later replies are dropped."""
        self._feeds.pop(tag, None)
        if self._tag_of.get(request_id) == tag and tag not in self._pending:
            del self._tag_of[request_id]

    @property
    def closing(self) -> bool:
        """Whether the client closes (or closed) this stream: nobody waits for the replies still to come."""
        return self._closing

    def fail(self, tag: str, exc: StreamServeError) -> None:
        """Resolve a call that is still waiting with an error (its deadline passed, its caller left)."""
        fut = self._pending.get(tag)
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    async def close(self, error: StreamServeError) -> None:
        """Stop reading, fail every request still waiting with ``error`` (cancelling the streams that have not ended),
        delete the stream."""
        self._closing = True
        # Cancelling a blocked XREAD inside redis-py can stall; wake the reader with an entry instead. (A Redis that
        # refuses writes refuses it: the reader is then woken by its block's end.)
        with contextlib.suppress(*RETRYABLE_ERRORS):
            try:
                await self._redis.xadd(self.name, {"wake": b""}, nomkstream=True)
            except ResponseError as exc:
                if not refuses_writes(exc):
                    raise
        for task in self._tasks:
            if task.get_name() != _READER_TASK:
                task.cancel()
        if self._tasks:
            _done, stuck = await asyncio.wait(self._tasks, timeout=REPLY_BLOCK_MS / 1000 + 1)
            for task in stuck:
                task.cancel()
        self._tasks = []
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(error)
        for feed in list(self._feeds.values()):
            feed.fail(error)
            feed.close()  # a stream not ended is cancelled: nobody will read its chunks
        with contextlib.suppress(*RETRYABLE_ERRORS):
            try:
                await self._redis.delete(self.name)
            except ResponseError as exc:  # (it lapses by itself)
                if not refuses_writes(exc):
                    raise

    async def _keep(self) -> None:
        """Refresh the expiry; recreate the stream if Redis lost it (restarted without its data). Redis away, or
        refusing writes (a full disk refuses EXPIRE), is tried again at the next refresh."""
        while True:
            await asyncio.sleep(REPLY_STREAM_TTL_S / 3)
            try:
                await self._ensure_exists()
            except RETRYABLE_ERRORS as exc:
                logger.warning("reply stream upkeep failed: %s", exc)
            except ResponseError as exc:
                if not refuses_writes(exc):
                    raise
                logger.warning("reply stream upkeep failed: %s", exc)

    async def _ensure_exists(self) -> None:
        if not await self._redis.expire(self.name, REPLY_STREAM_TTL_S):
            await self.create()

    async def _read(self) -> None:
        reader = BlockingReader(self._redis)
        backoff = Backoff(cap=_RETRY_CAP_S)
        loop = asyncio.get_running_loop()
        lost_at: float | None = None
        try:
            while not self._closing:
                try:
                    if lost_at is not None:
                        await self._ensure_exists()
                    batches = await reader.read(
                        (*_READ_REPLIES, self.name, self._last_id), REPLY_BLOCK_MS, self._trim()
                    )
                except RETRYABLE_ERRORS as exc:
                    if lost_at is None:
                        lost_at = loop.time()
                        logger.warning("reply reader lost Redis (%s); retrying", exc)
                    elif loop.time() - lost_at >= REPLY_OUTAGE_FAIL_S:
                        self._fail_waiting(exc)
                    await asyncio.sleep(backoff.next())
                    continue
                if lost_at is not None:
                    logger.warning("reply reader: Redis is back after %.1fs", loop.time() - lost_at)
                    lost_at = None
                    backoff.reset()
                for _stream, entries in batches:
                    for entry_id, fields in entries:
                        self._last_id = entry_id
                        self._resolve(fields)
                if self._to_flush:
                    self._flush()
                if batches:
                    # The callers this read woke write their answers before the next read is written: it came first,
                    # and cost each answer the write's turn (bench/RESULTS.md).
                    await asyncio.sleep(0)
        finally:
            await reader.aclose()

    def _trim(self) -> Command | None:
        """XTRIM of what was read, when there is some and the last trim is REPLY_TRIM_INTERVAL_S old; else None."""
        now = asyncio.get_running_loop().time()
        if self._last_id == self._trimmed_to or now < self._trim_due:
            return None
        self._trimmed_to, self._trim_due = self._last_id, now + REPLY_TRIM_INTERVAL_S
        return ("XTRIM", self.name, "MINID", self._last_id)

    def _fail_waiting(self, exc: Exception) -> None:
        """Fail every caller still waiting: their replies cannot reach them while Redis is away."""
        waiting = [fut for fut in self._pending.values() if not fut.done()]
        feeds = [feed for feed in self._feeds.values() if not feed.failed]
        if not waiting and not feeds:
            return
        # (every retryable error has a meaning: RedisUnavailableError naming the URL)
        cause = self._refusals.meaning(exc) or exc
        error = RedisUnavailableError(f"{cause}; lost while waiting for the reply: {_what_becomes_of_it()}")
        for fut in waiting:
            fut.set_exception(error)
        for feed in feeds:
            feed.fail(error)
        count = len(waiting) + len(feeds)
        logger.warning("reply reader: %d caller(s) failed after %.0fs without Redis", count, REPLY_OUTAGE_FAIL_S)

    def _resolve(self, fields: Fields) -> None:
        if b"parts" in fields:
            self._chunks(fields)
            return
        if b"hello" in fields or b"wake" in fields:
            return
        try:
            reply = Reply.decode(fields)
        except ProtocolError as exc:
            logger.warning("dropping unreadable reply: %s", exc)
            return
        tag = reply.tag or self._tag_of.get(reply.request_id, "")
        fut = self._pending.get(tag)
        if fut is not None:
            if reply.status is ReplyStatus.CHUNK:
                self._open_feed(tag, fut, reply)
            elif not fut.done():
                fut.set_result(reply)
            return
        feed = self._feeds.get(tag)
        if feed is not None:
            feed.add(reply)

    def _chunks(self, fields: Fields) -> None:
        """A ChunkBatch: each part to its stream's feed, or to its call's future if it is the stream's first."""
        try:
            batch = ChunkBatch.decode(fields)
        except ProtocolError as exc:
            logger.warning("dropping unreadable chunks: %s", exc)
            return
        replica_id = batch.replica_id
        for part in batch.parts:
            tag = part.tag or self._tag_of.get(part.request_id, "")
            feed = self._feeds.get(tag)
            if feed is not None:
                if feed.add_chunks(replica_id, part.window, part.seq, part.count, part.body):
                    self._to_flush.append(feed)
                continue
            fut = self._pending.get(tag)
            if fut is not None:
                self._open_feed(tag, fut, part.reply(replica_id))

    def _flush(self) -> None:
        feeds, self._to_flush = self._to_flush, []
        for feed in feeds:
            feed.flush()

    def _open_feed(self, tag: str, fut: asyncio.Future[Reply], first: Reply) -> None:
        """A request's first chunk: its later replies go to a feed from now on; its caller gets ``first``."""
        if fut.done():
            return  # it failed (deadline) or was abandoned: nobody would read the stream
        del self._pending[tag]
        first.tag = tag  # (a reply with no tag of its own was matched by its request id)
        feed = self._feeds[tag] = ChunkFeed(first.request_id)
        feed.add(first)
        fut.set_result(first)
