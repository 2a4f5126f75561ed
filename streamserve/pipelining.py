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
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

Command = tuple[EncodableT, ...]
"""One raw Redis command, e.g. ``("XACK", stream, group, entry_id)``."""


class Pipeliner:
    """Queues raw commands and sends each loop turn's worth in one non-transactional pipeline.

    Each ``execute`` gets the replies of its own commands, in order; a command
    that failed in Redis comes back as the exception instance, and a failed
    round trip (connection lost after the retry policy gave up) raises in every
    caller of that turn.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._queued: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def execute(self, *commands: Command) -> asyncio.Future[list[Any]]:
        """Queue ``commands`` for this turn's round trip; the future holds their replies."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if not self._queued:
            task = asyncio.create_task(self._send())  # runs after this turn: the batch is what queued by then
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        self._queued.append((commands, future))
        return future

    async def run_script(self, script: Script, keys: Sequence[EncodableT], args: Sequence[EncodableT]) -> Any:
        """EVALSHA ``script`` in this turn's round trip (loading it once if Redis does not know it)."""
        [reply] = await self.execute(("EVALSHA", script.sha, len(keys), *keys, *args))
        if isinstance(reply, NoScriptError):  # a restarted or flushed Redis: load it, then run it alone
            await self._redis.script_load(script.source)
            [reply] = await self.execute(("EVALSHA", script.sha, len(keys), *keys, *args))
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _send(self) -> None:
        batch, self._queued = self._queued, []
        try:
            replies = await self._round_trip([command for commands, _ in batch for command in commands])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for commands, future in batch:
            if not future.done():  # a caller that was cancelled no longer wants its replies
                future.set_result(replies[start : start + len(commands)])
            start += len(commands)

    async def _round_trip(self, commands: list[Command]) -> list[Any]:
        """Send ``commands`` in one write and read their replies, with the pool's retry policy."""
        # hiredis's stub types its argument as a 1-tuple; it takes a command of any length.
        packed = b"".join(hiredis.pack_command(command) for command in commands)  # type: ignore[arg-type]
        pool = self._redis.connection_pool
        connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]

        async def exchange() -> list[Any]:
            # One socket timeout for the whole exchange: redis-py would open a timeout context per reply.
            try:
                async with asyncio.timeout(connection.socket_timeout):
                    await connection.send_packed_command(packed)
                    return [await _read_reply(connection) for _ in commands]
            except TimeoutError as exc:
                await connection.disconnect(nowait=True)
                raise RedisTimeoutError(f"no reply from Redis within {connection.socket_timeout}s") from exc

        async def reset(_error: Exception) -> None:
            await connection.disconnect()

        try:
            replies: list[Any] = await connection.retry.call_with_retry(exchange, reset)
            return replies
        finally:
            await pool.release(connection)

    async def aclose(self) -> None:
        """Wait for what is being sent."""
        if self._sending:
            await asyncio.wait(set(self._sending))


async def _read_reply(connection: AbstractConnection) -> Any:
    """One reply; an error reply (the command failed in Redis) is returned, not raised."""
    try:
        return await connection.read_response(timeout=math.inf)  # bounded by exchange()'s timeout
    except ResponseError as exc:
        return exc


class Script:
    """A Lua script and its SHA1, for EVALSHA through a Pipeliner."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
