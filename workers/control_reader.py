"""A replica's control stream: what callers tell it about the requests it serves, read on a connection of its own.

Callers add to it with NOMKSTREAM (Keys.replica_control), so the replica makes
it when it starts, with a first entry, and deletes it when it exits. Each read
also renews the stream's expiry, so that one left by a replica killed with -9
does not outlive it for long; a renewal that finds it gone (it lapsed while
Redis refused writes) makes it again. Entries are dispatched by their ``kind`` field to
the handler of that kind; kinds with no handler (the first entry's, or a kind a
newer caller sends) are skipped. A Redis outage is waited out, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import redis.asyncio as aioredis

from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS
from streamserve.transport.pipelining import BlockingReader
from streamserve.transport.streams import CONTROL_STREAM_MAXLEN
from streamserve.wire.messages import SCHEMA_VERSION, Fields

logger = logging.getLogger(__name__)

# How long one read blocks (the reader is cancelled to stop, so this bounds only how often the expiry is renewed).
CONTROL_BLOCK_MS = 2000
# Entries taken by one read at most.
CONTROL_READ_COUNT = 1000
# The stream expires this long after its replica last read it: one left by a replica that died goes away by itself.
CONTROL_TTL_MS = 60_000
# The ``kind`` of the entry that makes the stream; nobody handles it.
OPENED = b"opened"

# A handler of one kind of control message, given the entry's fields; called on the event loop, it must not block.
ControlHandler = Callable[[Fields], None]


class ControlReader:
    """Makes the replica's control stream, reads it and dispatches each entry by kind, until closed."""

    def __init__(self, redis: aioredis.Redis, key: str, handlers: Mapping[bytes, ControlHandler], who: str) -> None:
        self._redis = redis
        self._key = key
        self._handlers = dict(handlers)
        self._who = who
        self._reader = BlockingReader(redis)
        # The id of the last entry dispatched (or of the first entry): reads go on after it.
        self._last: bytes = b"0-0"
        self._made = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Make the stream (Redis away: the reader makes it once Redis is back) and start reading it."""
        with contextlib.suppress(*RETRYABLE_ERRORS):
            await self._make()
        self._task = asyncio.create_task(self._run(), name="control-reader")

    async def aclose(self) -> None:
        """Stop reading and delete the stream: nobody serves its requests any more."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._reader.aclose()
        await self._redis.delete(self._key)

    async def _make(self) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self._key, {"v": SCHEMA_VERSION, "kind": OPENED}, maxlen=CONTROL_STREAM_MAXLEN, approximate=True)
            pipe.pexpire(self._key, CONTROL_TTL_MS)
            first, _ = await pipe.execute()
        if self._last == b"0-0":
            self._last = first  # reads start after it
        self._made = True

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                if not self._made:  # after an outage Redis may have lost it
                    await self._make()
                read = ("XREAD", "COUNT", CONTROL_READ_COUNT, "BLOCK", CONTROL_BLOCK_MS, "STREAMS", self._key)
                renew = ("PEXPIRE", self._key, CONTROL_TTL_MS)
                batches = await self._reader.read((*read, self._last), CONTROL_BLOCK_MS, before=renew)
                backoff.reset()
                if self._reader.before_reply == 0:
                    # Gone: it lapsed while Redis refused its renewals (a full disk, out of memory), or a Redis that
                    # restarted lost it. Callers add with NOMKSTREAM: made again, or their cancels go nowhere.
                    self._made = False
            except Exception as exc:  # Redis away, or anything else: the replica serves on, and this tries again
                self._made = False
                delay = backoff.next()
                level = logging.WARNING if isinstance(exc, RETRYABLE_ERRORS) else logging.ERROR
                logger.log(
                    level, "replica %s: reading its control stream failed (%s); again in %.1fs", self._who, exc, delay
                )
                await asyncio.sleep(delay)
                continue
            for _stream, entries in batches:
                for entry_id, fields in entries:
                    self._last = entry_id
                    self._dispatch(entry_id, fields)

    def _dispatch(self, entry_id: bytes, fields: Fields) -> None:
        handler = self._handlers.get(fields.get(b"kind", b""))
        if handler is None:
            return
        try:
            handler(fields)
        except Exception as exc:  # a malformed message: skipped
            logger.warning("replica %s: control message %s skipped: %s", self._who, entry_id.decode(), exc)
