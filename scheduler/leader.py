"""Leader election: one scheduler acts, any other waits as standby.

The lock is a Redis string holding the leader's id with an expiry; the
leader renews it well before it expires. A leader that cannot renew stops
acting at once, so two schedulers never act together for longer than one
renewal period.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from streamserve.wire import scripts
from streamserve.wire.ids import new_caller_id
from streamserve.wire.keys import Keys
from streamserve.wire.messages import text


class LeaderLock:
    """A renewable Redis lock naming the current leader."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, ttl_s: float = 5.0) -> None:
        self._redis = redis
        self._key = keys.scheduler_lock()
        self._ttl_ms = int(ttl_s * 1000)
        self.holder_id = new_caller_id()
        self._renew = redis.register_script(scripts.RENEW_LOCK)
        self._release = redis.register_script(scripts.RELEASE_LOCK)
        self.held = False

    async def acquire_or_renew(self) -> bool:
        """Take the lock if free, or extend it if ours; return whether we lead now."""
        if self.held:
            self.held = bool(await self._renew(keys=[self._key], args=[self.holder_id, self._ttl_ms]))
        else:
            self.held = bool(await self._redis.set(self._key, self.holder_id, nx=True, px=self._ttl_ms))
        return self.held

    async def release(self) -> None:
        if self.held:
            await self._release(keys=[self._key], args=[self.holder_id])
            self.held = False

    async def current_leader(self) -> str | None:
        raw = await self._redis.get(self._key)
        return text(raw) if raw is not None else None
