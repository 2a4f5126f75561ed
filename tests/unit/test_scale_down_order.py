"""docs/tutorial.md, "Autoscaling": "Scaling down stops replicas still starting first, then those holding the fewest
requests (as their last heartbeat says), the youngest of them first".

Ticked by hand on the fake clock, launcher and store of test_deployment_state; a replica is told apart by
the pid the fake launcher gave it, in start order.
"""

from __future__ import annotations

import pytest

from streamserve.scheduler.deployment_state import DeploymentState
from streamserve.scheduler.types import Timeouts
from streamserve.wire.messages import Heartbeat
from streamserve.wire.states import ReplicaHealth, ReplicaState
from tests.harness.fake_launcher import HOST
from tests.unit.test_deployment_state import Harness, target


@pytest.fixture
def h() -> Harness:
    return Harness()


def pids_of(h: Harness, state: ReplicaState) -> set[int]:
    return {record.pid for record in h.by_state(state) if record.pid is not None}


async def start_three_one_after_another(h: Harness) -> list[int]:
    """Scale 1, 2, 3, each replica RUNNING before the next starts; their pids, oldest first."""
    started: list[int] = []
    for count in (1, 2, 3):
        await h.tick(target(count), advance_ms=1_000)
        [new] = set(h.launcher.alive) - set(started)
        started.append(new)
        h.beat_all()
        await h.tick(target(count))
    assert h.counts() == {ReplicaState.RUNNING: 3}
    return started


async def test_scaling_3_to_2_stops_the_replica_that_started_last(h: Harness) -> None:
    oldest, middle, youngest = await start_three_one_after_another(h)
    await h.tick(target(2))
    assert h.launcher.terminated == [youngest]
    assert pids_of(h, ReplicaState.STOPPING) == {youngest}
    assert pids_of(h, ReplicaState.RUNNING) == {oldest, middle}


async def test_scaling_3_to_1_keeps_the_oldest(h: Harness) -> None:
    oldest, middle, youngest = await start_three_one_after_another(h)
    await h.tick(target(1))
    assert sorted(h.launcher.terminated) == sorted([middle, youngest])
    assert pids_of(h, ReplicaState.RUNNING) == {oldest}


async def test_a_replica_still_starting_goes_before_a_younger_one_that_serves(h: Harness) -> None:
    await h.tick(target(1), advance_ms=1_000)
    h.beat_all()
    await h.tick(target(1))
    [first] = pids_of(h, ReplicaState.RUNNING)
    await h.tick(target(2), advance_ms=1_000)
    [slow] = pids_of(h, ReplicaState.STARTING)  # a slow constructor: it stays STARTING
    await h.tick(target(3), advance_ms=1_000)
    [fast] = pids_of(h, ReplicaState.STARTING) - {slow}  # started later, ready sooner
    [fast_record] = [r for r in h.by_state(ReplicaState.STARTING) if r.pid == fast]
    h.beats[fast_record.replica_id] = Heartbeat(ts_ms=h.now, health=ReplicaHealth.READY, pid=fast, host=HOST)
    await h.tick(target(3))
    assert pids_of(h, ReplicaState.RUNNING) == {first, fast}
    assert pids_of(h, ReplicaState.STARTING) == {slow}

    await h.tick(target(2))
    assert h.launcher.terminated == [slow]
    assert pids_of(h, ReplicaState.RUNNING) == {first, fast}


async def test_a_scheduler_that_took_over_still_stops_the_youngest(h: Harness) -> None:
    """The start order survives a scheduler restart: the next one adopts the replicas from their records."""
    oldest, middle, youngest = await start_three_one_after_another(h)
    h.state = DeploymentState(
        "echo", h.launcher, h.store, Timeouts(heartbeat_timeout_ms=10_000, start_timeout_ms=60_000)
    )
    for record in sorted(h.store.records.values(), key=lambda r: r.pid or 0, reverse=True):  # youngest first
        h.state.adopt(record)
    h.beat_all()
    await h.tick(target(2))
    assert h.launcher.terminated == [youngest]
    assert pids_of(h, ReplicaState.RUNNING) == {oldest, middle}


def hold_requests(h: Harness, pid: int, ongoing: int) -> None:
    """The replica with ``pid`` says in its heartbeat that it holds ``ongoing`` requests (not news to the scheduler's
    reader: only the heartbeats hash has it)."""
    [record] = [r for r in h.by_state(ReplicaState.RUNNING) if r.pid == pid]
    h.beats[record.replica_id] = h.beats[record.replica_id].model_copy(update={"ongoing": ongoing})


async def test_scaling_down_keeps_the_replica_running_a_long_request(h: Harness) -> None:
    """The repro: two short requests ended on the older replicas, a long one runs on the youngest. 3 -> 1 stopped the
    youngest, whose request was cut after graceful_shutdown_timeout_s and ran again from the start elsewhere."""
    oldest, middle, youngest = await start_three_one_after_another(h)
    hold_requests(h, youngest, 1)
    await h.tick(target(1))
    assert sorted(h.launcher.terminated) == sorted([oldest, middle])  # idle: the middle one first, then the oldest
    assert pids_of(h, ReplicaState.RUNNING) == {youngest}


async def test_scaling_down_stops_the_least_busy_first_and_the_youngest_among_equals(h: Harness) -> None:
    oldest, middle, youngest = await start_three_one_after_another(h)
    hold_requests(h, oldest, 3)
    hold_requests(h, middle, 1)
    hold_requests(h, youngest, 2)
    await h.tick(target(2))
    assert h.launcher.terminated == [middle]
    hold_requests(h, oldest, 2)
    await h.tick(target(1))
    assert h.launcher.terminated == [middle, youngest]  # as busy as the oldest: the youngest goes
    assert pids_of(h, ReplicaState.RUNNING) == {oldest}
