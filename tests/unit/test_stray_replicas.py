"""A live replica the scheduler has no record of (started by hand, or left by a farm that was killed) is adopted
when it is wanted, at the wanted version, and otherwise retired through its record, which it reads and obeys."""

from __future__ import annotations

from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat
from streamserve.wire.states import ReplicaHealth, ReplicaState
from tests.unit.test_deployment_state import Harness, bring_up, target

S = ReplicaState


def stray(h: Harness, version: str, health: ReplicaHealth = ReplicaHealth.READY) -> str:
    replica_id = ReplicaID.new("echo").to_str()
    h.beats[replica_id] = Heartbeat(ts_ms=h.now, health=health, pid=4242, host="elsewhere", version=version)
    return replica_id


async def test_a_wanted_stray_is_adopted_instead_of_starting_a_process() -> None:
    h = Harness()
    t = target(1)
    found = stray(h, t.version or "")
    await h.tick(t)
    await h.tick(t)
    assert h.counts() == {S.RUNNING: 1} and h.launcher.alive == {}
    assert h.store.records[found].pid == 0  # known by its heartbeat only: never signalled by pid


async def test_a_stray_beyond_the_target_is_retired_through_its_record() -> None:
    h = Harness()
    t = target(1)
    await bring_up(h, t)
    found = stray(h, t.version or "")
    await h.tick(t)
    await h.tick(t)
    assert h.store.records[found].state in (S.SHOULD_STOP, S.STOPPING)  # what the stray reads, and obeys
    assert h.launcher.terminated == []  # our own replica keeps serving; the stray's pid is not ours
    del h.beats[found]  # it drained and said goodbye
    await h.tick(t)
    assert h.counts() == {S.RUNNING: 1} and found not in h.store.records


async def test_a_stray_of_an_old_version_is_replaced_not_kept() -> None:
    h = Harness()
    t = target(1, version="2")
    found = stray(h, target(1, version="1").version or "")
    await h.tick(t)
    h.beat_all()
    await h.tick(t)
    assert h.store.records[found].state in (S.SHOULD_STOP, S.STOPPING)
    assert h.counts()[S.RUNNING] == 1 and len(h.launcher.alive) == 1


async def test_a_stray_that_failed_or_drains_is_left_alone() -> None:
    h = Harness()
    t = target(0)
    stray(h, "", ReplicaHealth.FAILED)
    stray(h, "", ReplicaHealth.DRAINING)
    await h.tick(t)
    assert h.counts() == {} and h.store.health is not None and h.store.health.consecutive_failures == 0
