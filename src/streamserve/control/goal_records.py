"""Goals: the goals hash, whose records say where each desired-state write stands.

A goal is created in the same transaction as the write it tracks
(``desired.DesiredState``), the scheduler judges it (``scheduler/goals.py``),
and callers wait on it here. Every read and write of the hash goes through
``GoalStore``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import GoalFailedError, NotFoundError, ProtocolError, RequestTimeoutError
from streamserve.wire.ids import new_request_id
from streamserve.wire.keys import Keys
from streamserve.wire.messages import GoalRecord, text
from streamserve.wire.states import FINAL_GOAL_STATUSES, GoalStatus

logger = logging.getLogger(__name__)

GOAL_POLL_S = 0.1  # how often a waiter reads its goal again

ProgressCallback = Callable[[GoalRecord], Awaitable[None]]


def new_goal(name: str, kind: str, cfg: DeploymentConfig | None, now_ms: int) -> GoalRecord:
    """A PENDING goal for one deployment's write; ``cfg`` None for a delete."""
    return GoalRecord(
        goal_id=new_request_id(),
        deployment=name,
        kind=kind,
        version=cfg.code_version() if cfg is not None else "",
        replicas=cfg.wanted_replicas() if cfg is not None else 0,
        created_ms=now_ms,
        updated_ms=now_ms,
    )


class GoalStore:
    """The goals hash: create (inside a write's transaction), read, wait on, judge, prune."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._key = keys.goals()

    def stage(self, pipe: Pipeline, goal: GoalRecord) -> None:
        """Queue the goal's write on a MULTI pipeline, so it lands with the change it tracks."""
        pipe.hset(self._key, goal.goal_id, goal.encode())

    async def get(self, goal_id: str) -> GoalRecord:
        raw = await self._redis.hget(self._key, goal_id)
        if raw is None:
            raise NotFoundError(f"no goal {goal_id!r}: it never existed, or it finished long enough ago to be pruned")
        record: GoalRecord = GoalRecord.decode(raw)
        return record

    async def many(self, goal_ids: list[str]) -> list[GoalRecord]:
        """The goals that still exist among ``goal_ids``."""
        raw = await self._redis.hmget(self._key, goal_ids) if goal_ids else []
        return [GoalRecord.decode(r) for r in raw if r is not None]

    async def all(self) -> list[GoalRecord]:
        """Every goal; an unreadable record is logged and dropped."""
        goals = []
        for goal_id, raw in (await self._redis.hgetall(self._key)).items():
            try:
                goals.append(GoalRecord.decode(raw))
            except ProtocolError as exc:
                logger.warning("dropping unreadable goal %s: %s", text(goal_id), exc)
                await self._redis.hdel(self._key, goal_id)
        return goals

    async def save(self, goal: GoalRecord) -> None:
        await self._redis.hset(self._key, goal.goal_id, goal.encode())

    async def remove(self, goal_id: str) -> None:
        await self._redis.hdel(self._key, goal_id)

    async def wait(
        self, goal_id: str, timeout: float | None = None, on_progress: ProgressCallback | None = None
    ) -> GoalRecord:
        """Block until the goal is DONE; raise GoalFailedError if it failed or was cancelled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            goal = await self.get(goal_id)
            if goal.status is GoalStatus.DONE:
                return goal
            if goal.status is GoalStatus.FAILED:
                raise GoalFailedError(f"{goal.deployment}: {goal.message}")
            if goal.status in FINAL_GOAL_STATUSES:
                raise GoalFailedError(f"{goal.deployment}: goal {goal_id} cancelled: {goal.message}")
            if on_progress is not None:
                await on_progress(goal)
            if deadline is not None and time.monotonic() > deadline:
                raise RequestTimeoutError(
                    f"goal {goal_id} ({goal.kind} {goal.deployment}) not reached in {round(timeout or 0, 2):g}s"
                )
            await asyncio.sleep(GOAL_POLL_S)
