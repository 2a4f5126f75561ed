"""Commands issued during one event-loop turn go to Redis as one pipelined round trip.

Under load a gateway enqueues, and a replica acknowledges, many requests at
once. Sent one by one, each pays a connection checkout, a write syscall and a
read; profiles showed that as a third of the CPU a request costs on either
side. Coalesced, a turn's commands share all three. A lone command waits one
loop turn (microseconds) for company that may not come.

The round trip itself skips redis-py's pipeline: hiredis packs the commands
in C (redis-py's asyncio connection packs them in Python, argument by
argument) and the replies come back raw, with no response callbacks, since
every command here is raw already.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from streamserve.transport.cluster_routing import ClusterBlockingReader, ClusterRoundTrip, read_reply
from streamserve.transport.connections import is_cluster_client
from streamserve.wire.messages import Fields, StreamBatches

# One raw Redis command, e.g. ``("XACK", stream, group, entry_id)``.
Command = tuple[EncodableT, ...]
# What to send instead of some commands when their round trip is tried again after a lost connection: the
# commands may have run already, their answer lost with the connection (same count, replies alike).
Again = Callable[[], Sequence[Command]]
# Called with a turn's replies to commands whose caller stopped waiting (was cancelled) once they were queued: they
# were sent, and may have done what the caller no longer wants (queued a request, say). Called with the round trip's
# error instead when it failed: they may have reached Redis all the same (a Redis that hangs runs what it had read
# once it goes on).
Abandoned = Callable[[list[Any] | BaseException], None]


class Pipeliner:
    """Queues raw commands and sends each loop turn's worth in one non-transactional pipeline.

    Each ``execute`` gets the replies of its own commands, in order; a command
    that failed in Redis comes back as the exception instance, and a failed
    round trip (connection lost after the retry policy gave up) raises in every
    caller of that turn. A round trip that lost its connection is sent again by
    the retry policy: commands that must not run twice say what to send then
    (``again``).
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._queued: list[tuple[Sequence[Command], Again | None, asyncio.Future[list[Any]], Abandoned | None]] = []
        self._sending: set[asyncio.Task[None]] = set()
        # A connection between round trips, kept out of the pool: checking one out and back costs redis-py a lock, a
        # timeout context and its metrics hooks each time. A round trip that starts while another holds it takes one
        # from the pool.
        self._kept: AbstractConnection | None = None
        # On a Redis Cluster, a turn's commands go to the masters of their keys (cluster_routing).
        self._send_commands: Callable[[list[Command], Callable[[], list[Command]]], Awaitable[list[Any]]] = (
            ClusterRoundTrip(redis) if is_cluster_client(redis) else self._round_trip  # type: ignore[arg-type]
        )

    def execute(
        self, *commands: Command, again: Again | None = None, abandoned: Abandoned | None = None
    ) -> asyncio.Future[list[Any]]:
        """Queue ``commands`` for this turn's round trip; the future holds their replies.

        ``again``: called if the round trip is sent again after losing its connection, for what to send instead
        of ``commands`` (which may have run: say, an enqueue that must not add its request twice). ``abandoned``:
        called with their replies instead, should the future be cancelled before they come (they were sent all the
        same).
        """
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if not self._queued:
            task = asyncio.create_task(self._send())  # runs after this turn: the batch is what queued by then
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        self._queued.append((commands, again, future, abandoned))
        return future

    async def run_script(
        self,
        script: Script,
        keys: Sequence[EncodableT],
        args: Sequence[EncodableT],
        again: Again | None = None,
        abandoned: Abandoned | None = None,
    ) -> Any:
        """EVALSHA ``script`` in this turn's round trip (loading it once if Redis does not know it); ``again`` and
        ``abandoned`` (its list holds the script's one reply) as for ``execute``."""
        command: Command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        [reply] = await _replies(self.execute(command, again=again, abandoned=abandoned), abandoned)
        if isinstance(reply, NoScriptError):
            # A restarted or flushed Redis: sent whole, which loads it too (in one step: a flush in between cannot
            # make it miss again; and not by redis-py's script_load, which may swallow a cancellation of its caller).
            command = ("EVAL", script.source, len(keys), *keys, *args)
            [reply] = await _replies(self.execute(command, again=again, abandoned=abandoned), abandoned)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _send(self) -> None:
        batch, self._queued = self._queued, []

        def again() -> list[Command]:
            return [command for commands, resend, _, _ in batch for command in (resend() if resend else commands)]

        try:
            sent = [command for commands, _, _, _ in batch for command in commands]
            replies = await self._send_commands(sent, again)
        except BaseException as exc:
            for _, _, future, abandoned in batch:
                if not future.done():
                    future.set_exception(exc)
                elif abandoned is not None and future.cancelled():
                    abandoned(exc)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for commands, _, future, abandoned in batch:
            if not future.done():
                future.set_result(replies[start : start + len(commands)])
            elif abandoned is not None and future.cancelled():  # its caller no longer wants its replies
                abandoned(replies[start : start + len(commands)])
            start += len(commands)

    async def _round_trip(self, commands: list[Command], again: Callable[[], list[Command]]) -> list[Any]:
        """Send ``commands`` in one write and read their replies, with the pool's retry policy (which sends
        ``again()`` instead)."""
        packed: bytes | None = _pack(commands)  # None once it may have run: then again() is sent
        pool = self._redis.connection_pool
        connection, self._kept = self._kept, None
        if connection is None:
            connection = await pool.get_connection()  # type: ignore[no-untyped-call]

        async def exchange() -> list[Any]:
            # One socket timeout for the whole exchange: redis-py would open a timeout context per reply.
            try:
                async with asyncio.timeout(connection.socket_timeout):
                    if not connection.is_connected:
                        await connection.connect()
                    # Asked for only now, right before the write: what it depends on (has the caller its reply
                    # yet?) may have changed while the retry policy waited.
                    await connection.send_packed_command(packed if packed is not None else _pack(again()))
                    return [await read_reply(connection) for _ in commands]
            except TimeoutError as exc:
                await connection.disconnect(nowait=True)
                raise RedisTimeoutError(f"no reply from Redis within {connection.socket_timeout}s") from exc

        async def reset(_error: Exception) -> None:
            nonlocal packed
            await connection.disconnect()
            packed = None

        try:
            replies: list[Any] = await connection.retry.call_with_retry(exchange, reset)
        except BaseException:
            # Replies may be left unread on it: never keep it; the pool reconnects it before its next use.
            await connection.disconnect(nowait=True)
            await pool.release(connection)
            raise
        if self._kept is None:
            self._kept = connection
        else:
            await pool.release(connection)
        return replies

    async def aclose(self) -> None:
        """Wait for what is being sent, then give the kept connection back to the pool."""
        if self._sending:
            await asyncio.wait(set(self._sending))
        connection, self._kept = self._kept, None
        if connection is not None:
            await self._redis.connection_pool.release(connection)


async def _replies(future: asyncio.Future[list[Any]], abandoned: Abandoned | None) -> list[Any]:
    """``future``'s replies. A caller cancelled after they came, but before it resumed, never sees them: they go to
    ``abandoned`` instead (those that come after it was cancelled go there from ``_send``)."""
    try:
        return await future
    except asyncio.CancelledError:
        if abandoned is not None and future.done() and not future.cancelled():
            abandoned(future.exception() or future.result())
        raise


class BlockingReader:
    """Runs one blocking stream read at a time (XREAD or XREADGROUP with BLOCK) on a connection it keeps.

    Each caller process has one reply reader and each replica one request
    reader, looping on such reads: a kept connection saves a pool checkout per
    read, and the raw hiredis reply skips redis-py's per-entry parsing.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._cluster = ClusterBlockingReader(redis) if is_cluster_client(redis) else None  # type: ignore[arg-type]
        self._pool = None if self._cluster is not None else redis.connection_pool
        self._connection: AbstractConnection | None = None
        # The last read's ``before`` reply (an error reply as a ResponseError, not raised).
        self.before_reply: Any = None

    async def read(self, command: Command, block_ms: int, before: Command | None = None) -> StreamBatches:
        """The read's entries, by stream (empty when BLOCK passed with none); a failed connection is dropped.

        ``before``: a command sent ahead of the read in the same write (its reply, even an error, is kept in
        ``before_reply``, not raised), so that upkeep such as an expiry's renewal costs no round trip of its own.
        """
        self.before_reply = None
        if self._cluster is not None:
            reply = await self._cluster.read_raw(command, block_ms, before)
            self.before_reply = self._cluster.before_reply
            return _batches(reply)
        if self._connection is None:
            self._connection = await self._pool.get_connection()  # type: ignore[union-attr]
        connection = self._connection
        # The reply is due within BLOCK; the socket timeout on top, as redis-py would allow a blocking read.
        limit_s = block_ms / 1000 + (connection.socket_timeout or 0)
        packed = hiredis.pack_command(command)  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(limit_s):
                if before is None:
                    await connection.send_packed_command(packed)
                else:
                    await connection.send_packed_command(hiredis.pack_command(before) + packed)  # type: ignore[arg-type]
                    self.before_reply = await read_reply(connection)
                reply = await connection.read_response(timeout=math.inf)
        except ResponseError:
            raise  # the command failed (e.g. NOGROUP); the connection is fine
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise RedisTimeoutError(f"no reply from Redis within {limit_s:g}s") from exc
            raise
        return _batches(reply)

    async def aclose(self) -> None:
        """Give the connection back (disconnected: a read may still be running on it)."""
        if self._cluster is not None:
            await self._cluster.aclose()
            return
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.disconnect(nowait=True)
            await self._pool.release(connection)  # type: ignore[union-attr]


def _batches(reply: Any) -> StreamBatches:
    """A stream read's raw reply as entries by stream."""
    by_stream = reply.items() if isinstance(reply, dict) else reply or ()  # RESP3: a map; RESP2: pairs
    return [(stream, [(entry_id, _pairs(fields)) for entry_id, fields in entries]) for stream, entries in by_stream]


def _pack(commands: Sequence[Command]) -> bytes:
    # hiredis's stub types its argument as a 1-tuple; it takes a command of any length.
    return b"".join(hiredis.pack_command(command) for command in commands)  # type: ignore[arg-type]


def _pairs(flat: list[bytes] | None) -> Fields:
    """An entry's ``[field, value, field, value, ...]`` as a dict (None: the entry was deleted)."""
    if not flat:
        return {}
    items = iter(flat)
    return dict(zip(items, items, strict=False))  # Redis sends whole pairs; strict=True doubled this line


class Script:
    """A Lua script and its SHA1, for EVALSHA through a Pipeliner."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


def failure_of(sent: asyncio.Future[list[Any]]) -> BaseException | None:
    """What a round trip sent without waiting for it (``Pipeliner.execute``'s future, done) failed with: its own
    error, or the first command's error among its replies; None when it went through (or was cancelled)."""
    if sent.cancelled():
        return None
    error = sent.exception()
    if error is None:
        error = next((reply for reply in sent.result() if isinstance(reply, Exception)), None)
    return error
