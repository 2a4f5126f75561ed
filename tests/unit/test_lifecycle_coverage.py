"""Every move the replica lifecycle table allows is one the scheduler actually makes.

A move that is allowed but never taken is a rule nobody follows: the table
would then promise more than the scheduler does (or hide a path no test runs).
"""

from __future__ import annotations

from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat, ReplicaRecord
from streamserve.wire.states import REPLICA_TRANSITIONS, ReplicaHealth, ReplicaState
from tests.harness.fake_launcher import FakeLauncher
from tests.unit.test_deployment_state import Harness, MemoryStore, bring_up, external_target, target

S = ReplicaState


class RecordingStore(MemoryStore):
    """Remembers every state change saved for a replica: (old, new)."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: set[tuple[ReplicaState, ReplicaState]] = set()

    async def save(self, deployment: str, record: ReplicaRecord) -> None:
        old = self.records.get(record.replica_id)
        if old is not None and old.state is not record.state:
            self.moves.add((old.state, record.state))
        await super().save(deployment, record)


class SpawnFails(FakeLauncher):
    def start(self, replica_id: ReplicaID, gpus: tuple[str, ...] = ()) -> int:
        raise OSError("no such file: python")


def harness(launcher: FakeLauncher | None = None) -> tuple[Harness, RecordingStore]:
    h = Harness()
    store = RecordingStore()
    store.beats = h.beats
    h.store = store
    h.state._store = store
    if launcher is not None:
        h.launcher = launcher
        h.state._launcher = launcher
    return h, store


async def test_every_allowed_replica_move_is_taken() -> None:
    taken: set[tuple[ReplicaState, ReplicaState]] = set()

    # Up, scaled down (drained and gone), one dies while running.
    h, store = harness()
    await bring_up(h, target(3))
    await h.tick(target(2))
    await h.tick(target(2))
    for record in h.by_state(S.STOPPING):
        h.launcher.exit(record.pid)
    await h.tick(target(2))
    h.launcher.exit(h.by_state(S.RUNNING)[0].pid)
    await h.tick(target(2))
    taken |= store.moves

    # A start that fails; a replica retired while still starting.
    h, store = harness()
    await h.tick(target(2))
    first, second = h.by_state(S.STARTING)
    h.beat_all(ReplicaHealth.STARTING)
    h.beats[first.replica_id] = h.beats[first.replica_id].model_copy(
        update={"health": ReplicaHealth.FAILED, "message": "ImportError"}
    )
    await h.tick(target(0))  # the failed one is written off; the other is retired while starting
    assert store.moves >= {(S.STARTING, S.STOPPED), (S.STARTING, S.SHOULD_STOP)}, (first, second)
    taken |= store.moves

    # A process that cannot be spawned.
    h, store = harness(SpawnFails())
    await h.tick(target(1))
    taken |= store.moves

    # An externally started worker drains (its platform stopped it) and says goodbye.
    h, store = harness()
    external = external_target()
    h.beats["echo#w1"] = Heartbeat(ts_ms=h.now, health=ReplicaHealth.READY, pid=7, host="elsewhere", version="v")
    await h.tick(external)
    await h.tick(external)
    h.beats["echo#w1"] = h.beats["echo#w1"].model_copy(update={"health": ReplicaHealth.DRAINING, "ts_ms": h.now})
    await h.tick(external)
    del h.beats["echo#w1"]
    await h.tick(external)
    assert store.moves >= {(S.RUNNING, S.STOPPING), (S.STOPPING, S.STOPPED)}
    taken |= store.moves

    allowed = {(old, new) for old, moves in REPLICA_TRANSITIONS.items() for new in moves}
    assert allowed - taken == set(), "allowed but never taken"
    assert taken - allowed == set()
