"""The farm's Redis as a deployment of the tests sees it, from a replica process: one connection per process."""

from __future__ import annotations

import os
from functools import cache

import redis.asyncio as aioredis


@cache
def farm_redis() -> aioredis.Redis:
    """The Redis of the replica's farm (its REDIS_URL), made on first use and kept for the process."""
    return aioredis.Redis.from_url(os.environ["REDIS_URL"])
