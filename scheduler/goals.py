"""Completing goals: each desired-state write is DONE, FAILED or CANCELLED once the cluster says so."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis.asyncio as aioredis

from streamserve.control.goal_records import GoalStore
from streamserve.scheduler.deployment_state import DeploymentState, Target
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.keys import Keys
from streamserve.wire.messages import GoalRecord
from streamserve.wire.states import FINAL_GOAL_STATUSES, GoalStatus, ReplicaState

logger = logging.getLogger(__name__)

GOAL_RETENTION_MS = 3_600_000  # finished goals are pruned this long after they finish


class GoalTracker:
    """Reads the goals, compares each with the reconciled state, writes the verdicts."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._store = GoalStore(redis, keys)
        # Goal id -> its deployment's failed starts when this scheduler first saw the goal pending: a goal fails on
        # starts tried for it, not on the failures that made the deployment UNHEALTHY before it was written.
        self._failures_before: dict[str, int] = {}

    async def load(self) -> list[GoalRecord]:
        """Read before the desired state: a goal and its config are written together, so its config is then visible."""
        return await self._store.all()

    async def update(
        self,
        goals: list[GoalRecord],
        desired: Mapping[str, DeploymentConfig],
        states: Mapping[str, DeploymentState],
        now_ms: int,
    ) -> None:
        for goal in goals:
            if goal.status in FINAL_GOAL_STATUSES:
                self._failures_before.pop(goal.goal_id, None)
                if now_ms - goal.updated_ms > GOAL_RETENTION_MS:
                    await self._store.remove(goal.goal_id)
                continue
            state = states.get(goal.deployment)
            failed_starts = state.failed_starts if state is not None else 0
            before = self._failures_before.setdefault(goal.goal_id, failed_starts)
            verdict = _judge(goal, desired.get(goal.deployment), state, failed_starts > before)
            if verdict is not None:
                status, message = verdict
                update: dict[str, object] = {"status": status, "message": message, "updated_ms": now_ms}
                if status is GoalStatus.DONE and state is not None:
                    # What it was reached at: an autoscaled count may differ from the count asked for.
                    update["replicas"] = state.count(ReplicaState.RUNNING)
                done = goal.model_copy(update=update)
                await self._store.save(done)
                logger.info("goal %s (%s %s): %s %s", goal.goal_id, goal.kind, goal.deployment, status.value, message)


def _judge(
    goal: GoalRecord, cfg: DeploymentConfig | None, state: DeploymentState | None, failed_since: bool
) -> tuple[GoalStatus, str] | None:
    """The goal's new status and why, or None while it is still pending. ``failed_since``: a replica failed to start
    since the goal was first seen."""
    if goal.kind == "delete":
        if cfg is not None:
            return GoalStatus.CANCELLED, "the deployment was created again"
        return (GoalStatus.DONE, "") if state is None else None
    if cfg is None:
        return GoalStatus.CANCELLED, "the deployment was deleted"
    if (cfg.code_version(), cfg.wanted_replicas()) != (goal.version, goal.replicas):
        return GoalStatus.CANCELLED, "superseded by a later change"
    if state is None:
        return None
    # An autoscaled deployment is judged against the count autoscaling keeps now (min_replicas before any decision).
    if state.user_config_refused:
        return GoalStatus.FAILED, state.user_config_refused
    target = Target(cfg, autoscaled=state.autoscaled)
    if failed_since and state.failed_alone(target) and not state.replicas:
        # Its workers took the new code and failed to start on it, every one (each restarts on it in place): a goal
        # that read done with none running. (None live at all: one still starting on it may yet run it.)
        return GoalStatus.FAILED, state.last_failure
    if state.settled(target) and not state.user_config_behind:
        return GoalStatus.DONE, ""
    if state.unhealthy and failed_since:
        return GoalStatus.FAILED, state.last_failure
    if state.unschedulable:
        return GoalStatus.FAILED, state.unschedulable
    return None
