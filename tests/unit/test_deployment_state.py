"""The reconcile loop, ticked by hand with a fake clock, a fake launcher and an in-memory store."""

from __future__ import annotations

from collections import Counter

import pytest

from streamserve.scheduler.deployment_state import (
    KEEPS_FAILING,
    KEEPS_FAILING_MS,
    UNHEALTHY_AFTER_FAILURES,
    DeploymentState,
    Target,
)
from streamserve.scheduler.heartbeat_reader import Beats
from streamserve.scheduler.types import Timeouts
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import AutoscaleRecord, DeploymentHealthRecord, Heartbeat, ReplicaRecord
from streamserve.wire.states import DeploymentHealth, ReplicaHealth, ReplicaState
from tests.harness.fake_launcher import HOST, FakeLauncher


class MemoryStore:
    def __init__(self) -> None:
        self.records: dict[str, ReplicaRecord] = {}
        self.beats: dict[str, Heartbeat] = {}  # the heartbeat hash: removing a replica removes its beat too
        self.lines: list[str] = []  # what the scheduler added to the deployment's logs
        self.removed: list[str] = []
        self.health: DeploymentHealthRecord | None = None
        self.autoscale: AutoscaleRecord | None = None

    async def save(self, deployment: str, record: ReplicaRecord) -> None:
        self.records[record.replica_id] = record

    async def remove(self, deployment: str, replica_id: str) -> None:
        self.records.pop(replica_id, None)  # the record and its heartbeat; either may be gone already
        self.beats.pop(replica_id, None)
        self.removed.append(replica_id)

    async def save_health(self, deployment: str, record: DeploymentHealthRecord) -> None:
        self.health = record

    async def save_autoscale(self, deployment: str, record: AutoscaleRecord | None) -> None:
        self.autoscale = record

    async def held(self, deployment: str, replica_ids: list[str]) -> dict[str, int]:
        return {rid: beat.ongoing if (beat := self.beats.get(rid)) else 0 for rid in replica_ids}

    async def log_line(self, deployment: str, record: ReplicaRecord, line: str) -> None:
        self.lines.append(line)


class Harness:
    def __init__(self) -> None:
        self.launcher = FakeLauncher()
        self.store = MemoryStore()
        self.state_timeouts = Timeouts(heartbeat_timeout_ms=10_000, start_timeout_ms=60_000)
        self.state = DeploymentState("echo", self.launcher, self.store, self.state_timeouts)
        self.now = 1_000_000
        self.beats = self.store.beats

    async def tick(self, target: Target, advance_ms: int = 100) -> None:
        self.now += advance_ms
        await self.state.update(target, self.view(), self.now)

    def view(self) -> Beats:
        """The heartbeats as the scheduler's reader gives them: each beat's time is its ts_ms."""
        timeout_ms = self.state_timeouts.heartbeat_timeout_ms
        silent = {rid: beat.ts_ms for rid, beat in self.beats.items() if self.now - beat.ts_ms > timeout_ms}
        return Beats(self.beats, silent, self.now)

    def beat_all(self, health: ReplicaHealth = ReplicaHealth.READY, message: str = "") -> None:
        for r in self.state.replicas.values():
            if r.record.pid in self.launcher.alive:
                self.beats[r.record.replica_id] = Heartbeat(
                    ts_ms=self.now, health=health, pid=r.record.pid, host=HOST, message=message
                )

    def counts(self) -> Counter[ReplicaState]:
        return Counter(r.state for r in self.state.replicas.values())

    def by_state(self, state: ReplicaState) -> list[ReplicaRecord]:
        return [r.record for r in self.state.replicas.values() if r.state is state]


def target(replicas: int, version: str | None = None, **extra: object) -> Target:
    return Target(
        DeploymentConfig.model_validate(
            {"name": "echo", "import_path": "examples.echo:Echo", "num_replicas": replicas, "version": version, **extra}
        )
    )


def external_target(version: str | None = None) -> Target:
    """An externally scaled deployment: its replicas are whatever workers heartbeat."""
    return Target(
        DeploymentConfig.model_validate(
            {"name": "echo", "import_path": "examples.echo:Echo", "external_scaler_enabled": True, "version": version}
        )
    )


@pytest.fixture
def h() -> Harness:
    return Harness()


async def bring_up(h: Harness, t: Target) -> None:
    await h.tick(t)
    h.beat_all()
    await h.tick(t)


async def test_starts_target_then_running_on_ready(h: Harness) -> None:
    await h.tick(target(2))
    assert h.counts() == {ReplicaState.STARTING: 2}
    assert len(h.launcher.alive) == 2
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UPDATING
    h.beat_all()
    await h.tick(target(2))
    assert h.counts() == {ReplicaState.RUNNING: 2}
    assert h.store.health.health is DeploymentHealth.HEALTHY
    assert {r.state for r in h.store.records.values()} == {ReplicaState.RUNNING}


async def test_dead_process_is_replaced(h: Harness) -> None:
    await bring_up(h, target(2))
    victim = h.by_state(ReplicaState.RUNNING)[0]
    h.launcher.exit(victim.pid)
    await h.tick(target(2))
    assert victim.replica_id not in h.store.records
    assert h.counts() == {ReplicaState.RUNNING: 1, ReplicaState.STARTING: 1}


async def test_expired_heartbeat_kills_and_replaces(h: Harness) -> None:
    await bring_up(h, target(1))
    hung = h.by_state(ReplicaState.RUNNING)[0]
    await h.tick(target(1), advance_ms=11_000)  # heartbeat now 11 s old
    assert hung.pid in h.launcher.killed
    assert h.counts() == {ReplicaState.STARTING: 1}
    # Its process was seen alive: a handler blocking its loop is the likely cause, and status says so.
    assert h.store.health is not None and "(its process is alive: a handler that blocks" in h.store.health.message
    # A stopped process (SIGSTOP) is said to be stopped: no handler is to blame (found by an outside tester).
    [stalled] = h.by_state(ReplicaState.STARTING)
    h.beat_all()
    await h.tick(target(1))
    h.launcher.stopped.add(stalled.pid)
    await h.tick(target(1), advance_ms=11_000)
    assert "s (its process is stopped: SIGSTOP, Ctrl-Z, or a debugger)" in h.store.health.message, h.store.health


async def test_a_silent_replica_whose_process_cannot_be_seen_is_not_said_to_be_alive(h: Harness) -> None:
    """A stray adopted after `up` was killed -9 has no pid the scheduler may look at: it may have died (found by a
    review: status said its process was alive, and blamed a blocking handler)."""
    stray = ReplicaRecord(
        replica_id=ReplicaID("echo", "0123abcd").to_str(),
        state=ReplicaState.RUNNING,
        version=target(1).version,
        host=HOST,
        pid=0,
        created_ms=h.now,
        updated_ms=h.now,
    )
    h.state.adopt(stray)
    await h.tick(target(1), advance_ms=11_000)
    assert h.store.health is not None and "no heartbeat for 11.0s" in h.store.health.message, h.store.health
    assert "alive" not in h.store.health.message, h.store.health.message


async def test_scale_down_stops_gracefully_then_kills_at_deadline(h: Harness) -> None:
    await bring_up(h, target(3))
    await h.tick(target(1, graceful_shutdown_timeout_s=2))
    assert h.counts() == {ReplicaState.RUNNING: 1, ReplicaState.STOPPING: 2}
    stopping = h.by_state(ReplicaState.STOPPING)
    assert sorted(h.launcher.terminated) == sorted(r.pid for r in stopping)
    h.launcher.exit(stopping[0].pid)  # drains and exits by itself
    await h.tick(target(1))
    assert h.counts() == {ReplicaState.RUNNING: 1, ReplicaState.STOPPING: 1}
    await h.tick(target(1), advance_ms=5000)  # past the deadline: SIGKILL
    assert stopping[1].pid in h.launcher.killed
    await h.tick(target(1))
    assert h.counts() == {ReplicaState.RUNNING: 1}


async def test_scale_down_retires_starting_replicas_first(h: Harness) -> None:
    await bring_up(h, target(1))
    await h.tick(target(3))
    await h.tick(target(1))
    assert h.counts()[ReplicaState.RUNNING] == 1
    assert h.counts()[ReplicaState.STARTING] == 0


async def test_version_change_rolls_without_dropping_below_target(h: Harness) -> None:
    await bring_up(h, target(2, version="1"))
    old = {r.replica_id for r in h.by_state(ReplicaState.RUNNING)}
    await h.tick(target(2, version="2"))
    assert h.counts() == {ReplicaState.RUNNING: 2, ReplicaState.STARTING: 2}  # old keep serving
    h.beat_all()
    await h.tick(target(2, version="2"))
    running = h.by_state(ReplicaState.RUNNING)
    assert len(running) == 2 and old.isdisjoint(r.replica_id for r in running)
    assert h.counts()[ReplicaState.STOPPING] == 2


async def test_failing_start_backs_off_and_turns_unhealthy(h: Harness) -> None:
    t = target(1)
    for _ in range(UNHEALTHY_AFTER_FAILURES):
        # wait out the backoff until a new process is started, then make it fail
        for _ in range(400):
            await h.tick(t)
            if h.counts()[ReplicaState.STARTING]:
                break
        h.beat_all(ReplicaHealth.FAILED, "RuntimeError: weights not found")
        await h.tick(t)
    assert h.state.consecutive_failures == UNHEALTHY_AFTER_FAILURES
    assert h.store.health is not None
    assert h.store.health.health is DeploymentHealth.UNHEALTHY
    assert "weights not found" in h.store.health.message
    # backing off: the replacement waits as SHOULD_START instead of being started at once
    await h.tick(t)
    assert h.counts() == {ReplicaState.SHOULD_START: 1}


async def test_a_failed_scale_up_scaled_back_leaves_the_deployment_healthy(h: Harness) -> None:
    """Code broken on disk after the first replica started (no new version): the second one keeps failing to start;
    scaled back to the one that runs, the deployment stayed UNHEALTHY until some replica started, which none had
    to (found by an outside tester: `streamserve health` exited 1 for good)."""
    await bring_up(h, target(1))
    [running] = h.by_state(ReplicaState.RUNNING)
    for _ in range(UNHEALTHY_AFTER_FAILURES):
        for _ in range(400):
            await h.tick(target(2))
            if starting := h.by_state(ReplicaState.STARTING):
                break
        h.beats[starting[0].replica_id] = Heartbeat(
            ts_ms=h.now, health=ReplicaHealth.FAILED, pid=starting[0].pid, host=HOST, message="ImportError: broken"
        )
        h.beats[running.replica_id] = Heartbeat(ts_ms=h.now, health=ReplicaHealth.READY, pid=running.pid, host=HOST)
        await h.tick(target(2))
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UNHEALTHY
    h.beats[running.replica_id] = Heartbeat(ts_ms=h.now, health=ReplicaHealth.READY, pid=running.pid, host=HOST)
    await h.tick(target(1))
    await h.tick(target(1))
    assert h.counts() == {ReplicaState.RUNNING: 1}
    assert h.store.health.health is DeploymentHealth.HEALTHY, h.store.health


async def test_deleting_during_start_backoff_drops_the_unstarted_replica(h: Harness) -> None:
    t = target(1)
    await h.tick(t)
    h.beat_all(ReplicaHealth.FAILED, "boom")
    await h.tick(t)  # failed: its replacement waits out the backoff as SHOULD_START
    assert h.counts() == {ReplicaState.SHOULD_START: 1}
    await h.tick(Target(None))
    await h.tick(Target(None))
    assert h.state.is_gone
    assert h.store.records == {}


async def test_deleted_deployment_stops_everything(h: Harness) -> None:
    await bring_up(h, target(2))
    await h.tick(Target(None))
    assert h.counts() == {ReplicaState.STOPPING: 2}
    for pid in list(h.launcher.alive):
        h.launcher.exit(pid)
    await h.tick(Target(None))
    assert h.state.is_gone


async def test_deleting_a_deployment_with_a_user_config_is_not_judged_unhealthy(h: Harness) -> None:
    """Its target has no user_config (""), which a replica that refused none ("") matched: every delete was logged
    'UNHEALTHY (replica X: )', saying nothing."""
    t = target(1, user_config={"greeting": "hi"})
    await bring_up(h, t)
    for rid, beat in h.beats.items():
        h.beats[rid] = beat.model_copy(update={"user_config": t.user_config})
    await h.tick(t)
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.HEALTHY
    await h.tick(Target(None))
    assert h.store.health.health is not DeploymentHealth.UNHEALTHY, h.store.health


async def test_adopted_replicas_are_not_restarted(h: Harness) -> None:
    await bring_up(h, target(2))
    fresh = Harness()
    fresh.launcher = h.launcher
    fresh.state = DeploymentState("echo", h.launcher, fresh.store, Timeouts(10_000, 60_000))
    for record in h.store.records.values():
        fresh.state.adopt(record)
    fresh.now, fresh.beats = h.now, h.beats
    pids_before = set(h.launcher.alive)
    await fresh.tick(target(2))
    assert fresh.counts() == {ReplicaState.RUNNING: 2}
    assert set(h.launcher.alive) == pids_before


async def test_an_adopted_replica_found_gone_says_an_earlier_scheduler_started_it(h: Harness) -> None:
    """`up` killed -9, its replicas ended with it: the next one's scheduler said each had "process died", as if it
    had crashed, though their exit codes are not its to know."""
    await bring_up(h, target(1))
    fresh = Harness()
    fresh.state = DeploymentState("echo", fresh.launcher, fresh.store, Timeouts(10_000, 60_000))
    for record in h.store.records.values():
        fresh.state.adopt(record)  # its pid is no process of this (fresh) launcher's
    fresh.now = h.now
    await fresh.tick(target(1))
    assert fresh.store.health is not None
    assert "process gone (started by an earlier scheduler: how it ended is not known)" in fresh.store.health.message


async def test_a_replica_spawned_but_not_recorded_is_taken_over_not_started_twice(h: Harness) -> None:
    # The last scheduler saved SHOULD_START, spawned the process, and died before recording STARTING.
    await h.tick(target(0))
    record = ReplicaRecord(
        replica_id="echo#orphan",
        state=ReplicaState.SHOULD_START,
        version=target(1).version or "",
        created_ms=1,
        updated_ms=1,
    )
    orphan_pid = h.launcher.start(ReplicaID.from_str(record.replica_id))
    h.state.adopt(record)
    await h.tick(target(1))
    assert h.by_state(ReplicaState.STARTING)[0].pid == orphan_pid
    assert list(h.launcher.alive) == [orphan_pid]


async def test_replicas_it_stopped_are_retired_and_those_stopped_as_unhealthy_are_not(h: Harness) -> None:
    """What a replica still ran when a scale-down's drain ended is queued again uncharged (``retired``); a replica
    replaced for failing its check_health() may have been wedged by one of its requests: those stay charged."""
    await bring_up(h, target(3))
    await h.tick(target(1, graceful_shutdown_timeout_s=2))
    stopping = h.by_state(ReplicaState.STOPPING)
    h.launcher.exit(stopping[0].pid)  # leaves at its own drain limit
    await h.tick(target(1))
    await h.tick(target(1), advance_ms=5000)  # the other is killed at the deadline
    await h.tick(target(1))
    assert h.counts() == {ReplicaState.RUNNING: 1}
    assert h.state.retired == {r.replica_id for r in stopping}
    h.state.retired.clear()
    [running] = h.by_state(ReplicaState.RUNNING)
    h.beat_all(ReplicaHealth.UNHEALTHY, message="the database is gone")
    await h.tick(target(1))
    await h.tick(target(1))
    [replaced] = h.by_state(ReplicaState.STOPPING)
    assert replaced.replica_id == running.replica_id, replaced
    assert replaced.message.startswith("unhealthy: "), replaced
    h.launcher.exit(running.pid)
    await h.tick(target(1))
    assert h.state.retired == set()


async def test_replicas_that_keep_failing_their_check_make_the_deployment_unhealthy(h: Harness) -> None:
    """A check that always fails had each replica replaced within seconds, and between two replacements the
    deployment read HEALTHY (two times in three, to a probe or an alert): from the third within a minute it is
    UNHEALTHY, saying why; once they pass again and the minute is over, HEALTHY."""
    await bring_up(h, target(1))
    for replaced in range(1, KEEPS_FAILING + 1):
        h.beat_all(ReplicaHealth.UNHEALTHY, message="the database is gone")
        await h.tick(target(1))  # replaced: stopped, and another started
        for r in h.by_state(ReplicaState.STOPPING):
            h.launcher.exit(r.pid)
        await h.tick(target(1))
        h.beat_all()  # the new one starts well, and is RUNNING
        await h.tick(target(1))
        assert h.counts() == {ReplicaState.RUNNING: 1}, replaced
        expected = DeploymentHealth.UNHEALTHY if replaced >= KEEPS_FAILING else DeploymentHealth.HEALTHY
        assert h.store.health is not None and h.store.health.health is expected, (replaced, h.store.health)
    assert "keep failing their check_health(): 3 replaced within 60 s" in h.store.health.message
    assert "the database is gone" in h.store.health.message
    for _ in range(KEEPS_FAILING_MS // 5000 + 1):  # a minute of healthy beats
        h.beat_all()
        await h.tick(target(1), advance_ms=5000)
    assert h.store.health.health is DeploymentHealth.HEALTHY


async def test_the_keeps_failing_verdict_lasts_a_minute_from_the_last_replacement_or_until_a_new_version(
    h: Harness,
) -> None:
    """Replacements at 0, 50 and 58 s: UNHEALTHY until 118 s (it read HEALTHY from 60 s, two after the last one);
    a later replacement that leaves the last three wider than a minute does not end a verdict (found by a review)."""
    await bring_up(h, target(1))

    async def replace_one() -> None:
        h.beat_all(ReplicaHealth.UNHEALTHY, message="the database is gone")
        await h.tick(target(1))
        for r in h.by_state(ReplicaState.STOPPING):
            h.launcher.exit(r.pid)
        await h.tick(target(1))
        h.beat_all()
        await h.tick(target(1))

    async def healthy_for(ms: int) -> None:
        for _ in range(ms // 1000):
            h.beat_all()
            await h.tick(target(1), advance_ms=1000)

    for gap_ms in (0, 50_000, 8_000):
        await healthy_for(gap_ms)
        await replace_one()
    await healthy_for(KEEPS_FAILING_MS - 10_000)  # 52 s after the last one, 110 s after the first
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UNHEALTHY
    await healthy_for(10_000)
    assert h.store.health.health is DeploymentHealth.HEALTHY

    # Replacements at 0, 10 and 20 s, then one more at 70 s: the last three span 60 s, but the verdict of the first
    # three stands until a minute after the last one (the fourth had ended it at once).
    for gap_ms in (0, 10_000, 10_000, 50_000):
        await healthy_for(gap_ms)
        await replace_one()
    assert h.store.health.health is DeploymentHealth.UNHEALTHY
    await healthy_for(KEEPS_FAILING_MS - 5_000)
    assert h.store.health.health is DeploymentHealth.UNHEALTHY
    await healthy_for(10_000)
    assert h.store.health.health is DeploymentHealth.HEALTHY

    for _ in range(KEEPS_FAILING):
        await replace_one()
    assert h.store.health.health is DeploymentHealth.UNHEALTHY
    await bring_up(h, target(1, version="fixed"))
    await h.tick(target(1, version="fixed"))
    assert h.store.health.health is not DeploymentHealth.UNHEALTHY, h.store.health
