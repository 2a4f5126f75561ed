from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamserve.errors import ProtocolError
from streamserve.ids import ReplicaID
from streamserve.keys import Keys
from streamserve.states import REPLICA_TRANSITIONS, InvalidTransitionError, ReplicaState, check_replica_transition

ROOT = Path(__file__).resolve().parents[2]
KEY_LITERAL = re.compile(r"""["']streamserve:\S""")


def test_deployment_keys_share_a_hash_tag() -> None:
    keys = Keys()
    tagged = keys.deployment_keys("echo")
    assert all("{echo}" in k for k in tagged)
    assert keys.requests("echo") == "streamserve:{echo}:requests"
    assert keys.deployment_of_replicas_key(keys.replicas("my-model_2")) == "my-model_2"


def test_only_keys_module_spells_the_prefix() -> None:
    offenders = []
    for package in ("streamserve", "examples"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "keys.py" and KEY_LITERAL.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_replica_id_round_trip() -> None:
    rid = ReplicaID.new("echo")
    assert ReplicaID.from_str(rid.to_str()) == rid
    with pytest.raises(ProtocolError):
        ReplicaID.from_str("no-separator")


def test_transition_table_covers_every_state() -> None:
    assert set(REPLICA_TRANSITIONS) == set(ReplicaState)
    assert REPLICA_TRANSITIONS[ReplicaState.STOPPED] == frozenset()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (ReplicaState.SHOULD_START, ReplicaState.STARTING),
        (ReplicaState.STARTING, ReplicaState.RUNNING),
        (ReplicaState.RUNNING, ReplicaState.SHOULD_STOP),
        (ReplicaState.SHOULD_STOP, ReplicaState.STOPPING),
        (ReplicaState.STOPPING, ReplicaState.STOPPED),
        (ReplicaState.RUNNING, ReplicaState.STOPPED),
    ],
)
def test_allowed_transitions(old: ReplicaState, new: ReplicaState) -> None:
    check_replica_transition(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (ReplicaState.STOPPED, ReplicaState.STARTING),
        (ReplicaState.RUNNING, ReplicaState.STARTING),
        (ReplicaState.SHOULD_START, ReplicaState.RUNNING),
        (ReplicaState.STOPPING, ReplicaState.RUNNING),
    ],
)
def test_forbidden_transitions(old: ReplicaState, new: ReplicaState) -> None:
    with pytest.raises(InvalidTransitionError):
        check_replica_transition(old, new)
