from __future__ import annotations

import fnmatch
import re

import pytest
from redis.crc import key_slot

from streamserve.wire.errors import ProtocolError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.keys import Keys
from streamserve.wire.states import REPLICA_TRANSITIONS, InvalidTransitionError, ReplicaState, check_replica_transition
from tests.harness.paths import ROOT

KEY_LITERAL = re.compile(r"""["']streamserve:\S""")


def test_deployment_keys_share_a_hash_tag() -> None:
    keys = Keys()
    tagged = keys.deployment_keys("echo")
    assert all("{echo}" in k for k in tagged)
    assert keys.requests("echo") == "streamserve:{echo}:requests"
    assert keys.deployment_of_replicas_key(keys.replicas("my-model_2")) == "my-model_2"


def test_each_deployment_is_one_cluster_slot_and_the_farm_wide_keys_another() -> None:
    keys = Keys()
    assert {key_slot(k.encode()) for k in keys.deployment_keys("echo")} == {key_slot(b"echo")}
    farm_wide = [keys.deployments(), keys.endpoints(), keys.snapshot_ids(), keys.goals(), keys.deployment_status()]
    farm_wide += [keys.autoscaling(), keys.scheduler_lock()]
    assert {key_slot(k.encode()) for k in farm_wide} == {key_slot(b"streamserve")}
    assert keys.deployments() == "{streamserve}:deployments"
    assert Keys("acme").legacy_farm_keys()["acme:deployments"] == "{acme}:deployments"
    # Deployments, and callers' reply streams, spread over the slots by name.
    assert len({key_slot(keys.requests(f"d{i}").encode()) for i in range(20)}) == 20
    assert len({key_slot(keys.reply_stream(f"caller{i}").encode()) for i in range(20)}) == 20


@pytest.mark.parametrize(
    ("first", "second"),
    [(("default", "acme:k1"), ("acme", "k1")), (("a.b", "c:d"), ("a", "b.c:d")), (("default", "x"), ("acme", "x"))],
)
def test_no_two_tenants_keys_share_a_record(first: tuple[str, str], second: tuple[str, str]) -> None:
    keys = Keys()
    (tenant_a, key_a), (tenant_b, key_b) = first, second
    for name in (keys.idempotency, keys.idempotency_waiters, keys.job_idempotency):
        assert name("echo", key_a, tenant_a) != name("echo", key_b, tenant_b)
    assert keys.idempotency("echo", "k", "default") == "streamserve:{echo}:idem:k"  # as before tenants had keys


def test_a_deployments_job_keys_pattern_matches_every_tenants_keys_and_no_other_deployments() -> None:
    keys = Keys()
    pattern = keys.job_idempotency_pattern("echo")
    ours = [keys.job_idempotency("echo", "k:1"), keys.job_idempotency("echo", "k", "acme")]
    others = [
        keys.job_idempotency("echo-2", "k"),
        keys.job_idempotency("echo-2", "k", "acme"),
        keys.job_idempotency("ech", "o:k"),
    ]
    assert [fnmatch.fnmatchcase(k, pattern) for k in ours + others] == [True, True, False, False, False]


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
    assert REPLICA_TRANSITIONS[ReplicaState.STOPPED] == {}


S = ReplicaState
# The replica lifecycle, spelled out here so that any change to REPLICA_TRANSITIONS shows up as a failure.
ALLOWED_REPLICA_MOVES: frozenset[tuple[ReplicaState, ReplicaState]] = frozenset(
    {
        (S.SHOULD_START, S.STARTING),
        (S.SHOULD_START, S.STOPPED),
        (S.STARTING, S.RUNNING),
        (S.STARTING, S.SHOULD_STOP),
        (S.STARTING, S.STOPPED),
        (S.RUNNING, S.SHOULD_STOP),
        (S.RUNNING, S.STOPPING),
        (S.RUNNING, S.STOPPED),
        (S.SHOULD_STOP, S.STOPPING),
        (S.STOPPING, S.STOPPED),
    }
)


@pytest.mark.parametrize("new", list(ReplicaState), ids=lambda s: s.value)
@pytest.mark.parametrize("old", list(ReplicaState), ids=lambda s: s.value)
def test_every_replica_transition_matches_the_lifecycle(old: ReplicaState, new: ReplicaState) -> None:
    if (old, new) in ALLOWED_REPLICA_MOVES:
        check_replica_transition(old, new)
    else:
        with pytest.raises(InvalidTransitionError):
            check_replica_transition(old, new)
