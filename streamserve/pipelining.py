"""Commands issued during one event-loop turn go to Redis as one pipelined round trip.

Under load a gateway enqueues, and a replica acknowledges, many requests at
once. Sent one by one, each pays a connection checkout, a write syscall and a
read; profiles showed that as a third of the CPU a request costs on either
side. Coalesced, a turn's commands share all three. A lone command waits one
loop turn (microseconds) for company that may not come.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError
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
            async with self._redis.pipeline(transaction=False) as pipe:
                for commands, _ in batch:
                    for command in commands:
                        pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
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

    async def aclose(self) -> None:
        """Wait for what is being sent."""
        if self._sending:
            await asyncio.wait(set(self._sending))


class Script:
    """A Lua script and its SHA1, for EVALSHA through a Pipeliner."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
