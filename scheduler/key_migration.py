"""Renames the farm-wide keys of a farm that an older release kept, before the ``{prefix}`` hash tag.

A durable Redis outlives an upgrade: without this, the upgraded farm would
start empty beside its own deployments. Run by the scheduler before it leads.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from streamserve.transport.connections import is_cluster_client
from streamserve.wire.keys import Keys

logger = logging.getLogger(__name__)


async def migrate_farm_keys(redis: aioredis.Redis, keys: Keys) -> list[str]:
    """RENAMENX every old-named farm key to its current name; the names moved (none on a cluster, where the
    old names never worked)."""
    if is_cluster_client(redis):
        return []
    moved = []
    for old, new in keys.legacy_farm_keys().items():
        if await redis.exists(old) and await redis.renamenx(old, new):
            moved.append(old)
            logger.info("renamed %s to %s (the key layout since the Redis Cluster release)", old, new)
    return moved
