"""An autoscaled deployment reconciled tick by tick: the fake launcher, the in-memory store, a fake clock."""

from __future__ import annotations

from typing import Any

import pytest
from fakeredis import FakeAsyncRedis

from streamserve.control.desired_state import DesiredState
from streamserve.scheduler.autoscaler import Load
from streamserve.scheduler.deployment_state import UNHEALTHY_AFTER_FAILURES, DeploymentState, Target
from streamserve.scheduler.goals import GoalTracker
from streamserve.scheduler.types import Timeouts
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.keys import Keys
from streamserve.wire.states import DeploymentHealth, GoalStatus, ReplicaHealth, ReplicaState
from tests.unit.test_deployment_state import Harness

AUTO = {
    "min_replicas": 0,
    "max_replicas": 4,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 1,
    "downscale_delay_s": 10,
}


def autoscaled(**auto: Any) -> Target:
    return Target(
        DeploymentConfig.model_validate(
            {"name": "echo", "import_path": "examples.echo:Echo", "autoscaling_config": {**AUTO, **auto}}
        )
    )


def fixed(replicas: int) -> Target:
    cfg = {"name": "echo", "import_path": "examples.echo:Echo", "num_replicas": replicas}
    return Target(DeploymentConfig.model_validate(cfg))


async def tick(h: Harness, t: Target, ongoing: int = 0, advance_ms: int = 200, last_read: int = 0) -> None:
    """One scheduler tick: replicas are ready once started and exit once told to stop. ``last_read``: when (Redis's
    ms) the last request was read from the deployment's (normal-priority) stream."""
    h.now += advance_ms
    h.beat_all()
    await h.state.update(t, h.view(), h.now, Load(ongoing, ((0, 0), (last_read, 0), (0, 0))))
    for pid in h.launcher.terminated:
        h.launcher.exit(pid)


async def hold(h: Harness, t: Target, ongoing: int, seconds: float) -> None:
    for _ in range(int(seconds * 5)):
        await tick(h, t, ongoing)


def active(h: Harness) -> int:
    return sum(n for state, n in h.counts().items() if state in (ReplicaState.STARTING, ReplicaState.RUNNING))


@pytest.fixture
def h() -> Harness:
    return Harness()


async def test_min_zero_starts_with_nothing_and_is_healthy(h: Harness) -> None:
    await hold(h, autoscaled(), 0, 2)
    assert h.state.replicas == {}
    assert h.state.autoscaled == 0
    assert h.store.autoscale is not None and h.store.autoscale.replicas == 0
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.HEALTHY


async def test_a_queued_request_starts_the_first_replica_in_the_same_tick(h: Harness) -> None:
    t = autoscaled(upscale_delay_s=30)
    await hold(h, t, 0, 2)
    await tick(h, t, ongoing=1)
    assert h.counts() == {ReplicaState.STARTING: 1}
    assert h.store.autoscale is not None and h.store.autoscale.replicas == 1
    assert "waiting and no replica" in h.store.autoscale.reason


async def test_scales_up_under_load_and_back_to_zero_when_idle(h: Harness) -> None:
    t = autoscaled()
    await tick(h, t, ongoing=8)
    assert active(h) == 1
    await hold(h, t, 8, 0.6)
    assert active(h) == 1  # a second replica is not yet due
    await hold(h, t, 8, 1.0)
    assert active(h) == 4 and h.state.autoscaled == 4
    await hold(h, t, 0, 9)
    assert active(h) == 4  # idle, but not for downscale_delay_s yet
    await hold(h, t, 0, 5)
    await tick(h, t)
    assert h.state.replicas == {}
    assert h.store.autoscale is not None and h.store.autoscale.replicas == 0


async def test_a_broken_deployment_autoscaled_from_zero_backs_off_and_turns_unhealthy(h: Harness) -> None:
    """A request waits, so the autoscaler keeps one replica wanted, and each start fails: as with a fixed count, the
    starts back off and the deployment turns UNHEALTHY (its new callers get 503), though its minimum is 0."""
    t = autoscaled()
    for _ in range(UNHEALTHY_AFTER_FAILURES):
        for _ in range(400):  # wait out the backoff until a new process is started, then make it fail
            h.now += 200
            await h.state.update(t, h.view(), h.now, Load(1))
            if h.counts().get(ReplicaState.STARTING):
                break
        h.beat_all(ReplicaHealth.FAILED, "ModuleNotFoundError: No module named 'examples.nothere'")
        h.now += 200
        await h.state.update(t, h.view(), h.now, Load(1))
    assert h.state.consecutive_failures == UNHEALTHY_AFTER_FAILURES
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UNHEALTHY
    assert "nothere" in h.store.health.message


async def test_persisted_count_is_resumed_by_a_new_state(h: Harness) -> None:
    t = autoscaled()
    await tick(h, t, ongoing=8)
    await hold(h, t, 8, 2)
    assert h.state.autoscaled == 4
    fresh = DeploymentState("echo", h.launcher, h.store, Timeouts(10_000, 60_000))
    for record in h.store.records.values():
        fresh.adopt(record)
    assert h.store.autoscale is not None
    fresh.restore_autoscaled(h.store.autoscale)
    h.state = fresh
    await tick(h, t, ongoing=0)
    assert active(h) == 4 and fresh.autoscaled == 4  # the delay starts over: nothing is stopped at once


async def test_requests_that_come_and_go_between_ticks_keep_the_replica(h: Harness) -> None:
    """A 50 ms request every 1.5 s is never in the queue when a tick looks (ongoing 0 at every tick); the id of the
    last request read moves, and that keeps the one replica: no cold start for the next caller. Once the requests
    stop, the replica goes downscale_delay_s (up to 2 s more, the look-back) after the last one."""
    t = autoscaled(downscale_delay_s=10)
    await tick(h, t, ongoing=1)  # 0 -> 1 for the first request
    assert h.state.autoscaled == 1
    last_read = 0
    for i in range(45 * 5):  # 45 s of ticks, a request read every 7-8 ticks
        if i % 15 in (0, 7):
            last_read = h.now
        await tick(h, t, last_read=last_read)
        assert h.state.autoscaled == 1, f"scaled to {h.state.autoscaled} after {i / 5:.1f} s of a steady trickle"
    quiet = 0
    while h.state.autoscaled == 1 and quiet < 20 * 5:
        await tick(h, t, last_read=last_read)
        quiet += 1
    assert h.state.autoscaled == 0 and 10_000 < h.now - last_read <= 12_200  # (seen a tick after it was read)


async def test_autoscaling_turned_on_starts_from_what_runs(h: Harness) -> None:
    await hold(h, fixed(3), 0, 1)
    assert active(h) == 3
    await tick(h, autoscaled(min_replicas=1), ongoing=6)
    assert active(h) == 3 and h.state.autoscaled == 3
    assert h.launcher.terminated == []


async def test_autoscaling_turned_off_forgets_the_count(h: Harness) -> None:
    await tick(h, autoscaled(), ongoing=3)
    assert h.store.autoscale is not None
    await hold(h, fixed(2), 0, 1)
    assert h.state.autoscaled is None and h.store.autoscale is None
    assert active(h) == 2


async def test_new_bounds_apply_at_once(h: Harness) -> None:
    await tick(h, autoscaled(), ongoing=8)
    await hold(h, autoscaled(), 8, 2)
    assert active(h) == 4
    await tick(h, autoscaled(max_replicas=2), ongoing=8)
    assert active(h) == 2


async def test_shutting_down_stops_everything_and_keeps_the_decision(h: Harness) -> None:
    t = autoscaled()
    await tick(h, t, ongoing=8)
    await hold(h, t, 8, 2)
    await hold(h, Target(t.cfg, shutting_down=True), 8, 1)
    assert h.state.replicas == {}
    assert h.store.autoscale is not None and h.store.autoscale.replicas == 4  # the next scheduler resumes at 4


# -- goals of autoscaled deployments (fakeredis holds the goal records) ---------------------------------------------


async def run_goals(h: Harness, redis: FakeAsyncRedis, cfg: DeploymentConfig) -> list[Any]:
    tracker = GoalTracker(redis, Keys())
    await tracker.update(await tracker.load(), {cfg.name: cfg}, {cfg.name: h.state}, h.now)
    return await tracker.load()


async def test_goal_of_a_min_zero_deployment_is_done_with_no_replica(h: Harness) -> None:
    redis = FakeAsyncRedis()
    t = autoscaled()
    assert t.cfg is not None
    await DesiredState(redis, Keys()).apply(AppConfig(deployments=[t.cfg]))
    await tick(h, t)
    [goal] = await run_goals(h, redis, t.cfg)
    assert goal.status is GoalStatus.DONE and goal.replicas == 0


async def test_goal_is_judged_against_the_autoscaled_count(h: Harness) -> None:
    redis = FakeAsyncRedis()
    t = autoscaled(min_replicas=1, upscale_delay_s=0)
    assert t.cfg is not None
    await DesiredState(redis, Keys()).apply(AppConfig(deployments=[t.cfg]))
    await tick(h, t, ongoing=6)  # min 1, and the queue asks for 3 at once
    assert active(h) == 3
    [goal] = await run_goals(h, redis, t.cfg)
    assert goal.status is GoalStatus.PENDING  # 3 starting, none running yet
    await tick(h, t, ongoing=6)
    [goal] = await run_goals(h, redis, t.cfg)
    assert goal.status is GoalStatus.DONE and goal.replicas == 3
