"""What the commands that read or write the control plane share: its stores, on one connection per command."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio as aioredis

from streamserve.control.desired_state import DesiredState
from streamserve.control.goal_records import GoalStore
from streamserve.control.status import StatusReader
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.keys import Keys

T = TypeVar("T")


@dataclass(frozen=True)
class Stores:
    """What the commands read and write, on one connection."""

    desired: DesiredState
    goals: GoalStore
    status: StatusReader
    redis: aioredis.Redis
    keys: Keys

    async def scheduler_leads(self) -> bool:
        """Whether a scheduler holds the leader's lock (none: nobody acts on goals or runs replicas)."""
        return await self.redis.get(self.keys.scheduler_lock()) is not None


def with_stores(settings: Settings, fn: Callable[[Stores], Awaitable[T]]) -> T:
    """Run ``fn`` on a fresh connection to the farm's Redis (closed after it), in a new event loop."""

    async def run() -> T:
        redis = async_redis(settings.effective_redis_url)
        try:
            keys = settings.keys
            desired = DesiredState(redis, keys, settings.import_allow_list, settings.config_limit_values)
            return await fn(Stores(desired, GoalStore(redis, keys), StatusReader(redis, keys), redis, keys))
        finally:
            await redis.aclose()

    return asyncio.run(run())
