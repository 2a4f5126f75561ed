"""`streamserve health`: whether the farm is well, for container exec probes and scripts.

It is well when a scheduler leads (holds the leader key, and renews it) and
the scheduler's last verdict on every deployment is HEALTHY.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from streamserve.control.status import StatusReader
from streamserve.wire.keys import LEADER_LOCK_TTL_S, Keys
from streamserve.wire.messages import text
from streamserve.wire.states import DeploymentHealth

# A leader lock not renewed for this long, or for this many ticks if longer, is a leader that has stopped: a tick
# renews it before its work, which may take a while (many deployments, a distant Redis), so well above a tick.
STALLED_AFTER_S = 3.0
STALLED_TICKS = 10


async def farm_problems(redis: aioredis.Redis, keys: Keys, tick_interval_s: float = 0.2) -> list[str]:
    """One line per reason the farm is not well; none when it is. ``tick_interval_s``: the schedulers' (each tick
    renews the leader's lock)."""
    problems = []
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(keys.scheduler_lock())
        pipe.pttl(keys.scheduler_lock())
        leader, left_ms = await pipe.execute()
    # Renewed every tick: one not renewed for a few ticks (at least STALLED_AFTER_S) has stopped, or lost Redis; the
    # lock still named it for the rest of its TTL, and deployments whose replicas died with it still read HEALTHY.
    stalled_ms = 1000 * max(STALLED_AFTER_S, STALLED_TICKS * tick_interval_s)
    if leader is None:
        problems.append("no scheduler leads: none is running, or none reaches Redis")
    elif 0 <= left_ms < 1000 * LEADER_LOCK_TTL_S - stalled_ms:
        silent_s = LEADER_LOCK_TTL_S - left_ms / 1000
        problems.append(
            f"the leading scheduler ({text(leader)}) has not renewed its lead for {silent_s:.1f}s: it stopped, or"
            f" cannot reach Redis; another takes over within {left_ms / 1000:.1f}s"
        )
    for deployment in await StatusReader(redis, keys).status():
        if deployment.health != DeploymentHealth.HEALTHY.value:
            reason = f": {deployment.message}" if deployment.message else ""
            problems.append(f"{deployment.name}: {deployment.health}{reason}")
    return problems
