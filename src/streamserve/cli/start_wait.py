"""What `up` waits for before its banner: every deployment of its config running the replicas it wants.

A deployment the config changed has a goal, which the scheduler judges. One it left unchanged (`up` again on the same
data, say) has none: for it `up` waits on the scheduler's verdict instead, as ``deploy --wait`` does
(cli/writes.py), taking only a verdict written since this `up` started, since the one kept in Redis is the verdict of
the farm that ran before. Either way the first request after the banner is served at once (docs/tutorial.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from streamserve.control.desired_state import DesiredState
from streamserve.control.goal_records import GOAL_POLL_S, GoalStore
from streamserve.control.status import StatusReader
from streamserve.transport.connections import RETRYABLE_ERRORS, async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig, EndpointConfig
from streamserve.wire.keys import Keys
from streamserve.wire.states import FINAL_GOAL_STATUSES, DeploymentHealth, GoalStatus


async def replicas_not_running(
    url: str,
    keys: Keys,
    config: AppConfig,
    goal_ids: dict[str, str],
    since_ms: int,
    timeout_s: float,
    stop: Callable[[], bool],
) -> dict[str, str]:
    """Wait until each deployment of ``config`` runs its replicas or cannot (changed ones: their goal in
    ``goal_ids``; the others: a verdict written since ``since_ms``), ``timeout_s`` passes or ``stop()`` says so
    (it is called on every poll). Returns {deployment: why} for those not running."""
    # Externally scaled deployments run the workers someone else starts: nothing of theirs to wait for.
    unchanged = [d.name for d in config.deployments if d.name not in goal_ids and not d.external_scaler_enabled]
    pending = f"still starting after {timeout_s:g}s"
    not_running = {name: pending for name in [*goal_ids, *unchanged]}
    redis = async_redis(url)
    try:
        goals, status = GoalStore(redis, keys), StatusReader(redis, keys)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                records = await goals.many(list(goal_ids.values()))
                verdicts = await status.health_of_all()
            except RETRYABLE_ERRORS:
                pass  # Redis died, and was started again just now or will be: the wait rides it out
            else:
                not_running = {
                    g.deployment: g.message or (pending if g.status is GoalStatus.PENDING else g.status.value)
                    for g in records
                    if g.status is not GoalStatus.DONE
                }
                settled = all(g.status in FINAL_GOAL_STATUSES for g in records)
                for name in unchanged:
                    verdict = verdicts.get(name)
                    fresh = verdict if verdict is not None and verdict.updated_ms >= since_ms else None
                    if fresh is not None and fresh.health is DeploymentHealth.UNHEALTHY:
                        not_running[name] = fresh.message or fresh.health.value
                    elif fresh is None or fresh.health is not DeploymentHealth.HEALTHY:
                        not_running[name] = (fresh.message if fresh else "") or pending  # (what it waits for)
                        settled = False
                if settled:
                    return not_running
            if stop() or time.monotonic() > deadline:
                return not_running
            await asyncio.sleep(GOAL_POLL_S)
    finally:
        await redis.aclose()


async def kept_beyond(url: str, keys: Keys, config: AppConfig) -> tuple[list[DeploymentConfig], list[EndpointConfig]]:
    """The deployments and endpoints the farm serves that ``config`` does not name (deployed earlier with `deploy` or
    `traffic`, kept in Redis), by name; none when Redis cannot say."""
    redis = async_redis(url)
    try:
        desired = DesiredState(redis, keys)
        deployments, endpoints = await desired.deployments(), await desired.endpoints()
    except RETRYABLE_ERRORS:
        return [], []
    finally:
        await redis.aclose()
    named = {d.name for d in config.deployments} | {e.name for e in config.endpoints}
    return (
        [deployments[name] for name in sorted(deployments) if name not in named],
        [endpoints[name] for name in sorted(endpoints) if name not in named],
    )
