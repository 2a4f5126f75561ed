"""Leader election: one scheduler acts, any other waits as standby.

The lock is a Redis string holding the leader's id with an expiry; the
leader renews it well before it expires. A leader that cannot renew stops
acting at once, so two schedulers never act together for longer than one
renewal period; but where Redis refuses every write (it cannot persist),
it goes on, since nobody can take the lock then either.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from streamserve.transport.connections import refuses_writes
from streamserve.wire import scripts
from streamserve.wire.ids import new_caller_id
from streamserve.wire.keys import LEADER_LOCK_TTL_S, Keys
from streamserve.wire.messages import text


class LeaderLock:
    """A renewable Redis lock naming the current leader."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, ttl_s: float = LEADER_LOCK_TTL_S) -> None:
        self._redis = redis
        self._key = keys.scheduler_lock()
        self._ttl_ms = int(ttl_s * 1000)
        self.holder_id = new_caller_id()
        self._renew = redis.register_script(scripts.RENEW_LOCK)
        self._release = redis.register_script(scripts.DELETE_IF_VALUE)
        self.held = False
        # Why the last renewal found Redis refusing writes (out of memory, or unable to persist), None if it did not.
        self.writes_refused: Exception | None = None

    async def acquire_or_renew(self) -> bool:
        """Take the lock if free, or extend it if ours; return whether we lead now.

        A Redis out of memory still lets us keep the lock, but refuses to let us take a free one: then this raises,
        and the lock is not held. One that cannot persist (MISCONF) refuses even the renewal: the lock stays ours
        until it lapses, and nobody can take it meanwhile. ``writes_refused`` says why the last renewal found Redis
        refusing writes.
        """
        self.writes_refused = None
        try:
            if self.held:
                held, refused = await self._renew(keys=[self._key], args=[self.holder_id, self._ttl_ms])
                self.held = bool(held)
                if refused:
                    self.writes_refused = OutOfMemoryError("the leader lock's renewal was refused for lack of memory")
            else:
                self.held = bool(await self._redis.set(self._key, self.holder_id, nx=True, px=self._ttl_ms))
        except Exception as exc:
            if not refuses_writes(exc):
                raise
            if not self.held:  # (SET NX of a free lock, refused: it stays free)
                raise
            self.writes_refused = exc
        return self.held

    async def release(self) -> None:
        if self.held:
            await self._release(keys=[self._key], args=[self.holder_id])
            self.held = False

    @property
    def ttl_s(self) -> float:
        """How long the lock outlives its holder's last renewal."""
        return self._ttl_ms / 1000

    async def current_leader(self) -> str | None:
        raw = await self._redis.get(self._key)
        return text(raw) if raw is not None else None
