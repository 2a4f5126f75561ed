"""`streamserve health`: whether the farm is well, for container exec probes and scripts.

It is well when a scheduler leads (holds the leader key) and the scheduler's
last verdict on every deployment is HEALTHY.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from streamserve.control.status import StatusReader
from streamserve.wire.keys import Keys
from streamserve.wire.states import DeploymentHealth


async def farm_problems(redis: aioredis.Redis, keys: Keys) -> list[str]:
    """One line per reason the farm is not well; none when it is."""
    problems = []
    if await redis.get(keys.scheduler_lock()) is None:
        problems.append("no scheduler leads: none is running, or none reaches Redis")
    for deployment in await StatusReader(redis, keys).status():
        if deployment.health != DeploymentHealth.HEALTHY.value:
            reason = f": {deployment.message}" if deployment.message else ""
            problems.append(f"{deployment.name}: {deployment.health}{reason}")
    return problems
