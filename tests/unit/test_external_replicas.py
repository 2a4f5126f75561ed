"""Externally scaled deployments: the scheduler counts, judges and writes off workers it never started."""

from __future__ import annotations

from streamserve.scheduler.deployment_state import UNHEALTHY_AFTER_FAILURES, Target
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat
from streamserve.wire.states import DeploymentHealth, ReplicaHealth, ReplicaState
from tests.unit.test_deployment_state import Harness, bring_up, external_target, target

S = ReplicaState


def beat(h: Harness, health: ReplicaHealth = ReplicaHealth.READY, version: str = "", **extra: object) -> Heartbeat:
    return Heartbeat(ts_ms=h.now, health=health, pid=42, host="node-b", version=version, **extra)


def worker(h: Harness) -> str:
    return ReplicaID.new("echo").to_str()


async def one_running_worker() -> tuple[Harness, Target, str]:
    """An externally scaled deployment with one worker that has joined and is RUNNING."""
    h, t = Harness(), external_target()
    w = worker(h)
    h.beats[w] = beat(h)
    await h.tick(t)
    await h.tick(t)
    assert h.counts() == {S.RUNNING: 1}
    return h, t, w


async def test_a_worker_that_heartbeats_is_a_replica_and_nothing_is_started() -> None:
    h = Harness()
    t = external_target("1")
    await h.tick(t)
    assert h.counts() == {} and h.launcher.alive == {}  # nothing of ours, ever
    w = worker(h)
    h.beats[w] = beat(h, ReplicaHealth.STARTING)
    await h.tick(t)
    assert h.counts() == {S.STARTING: 1}
    record = h.store.records[w]
    assert (record.host, record.pid, record.external) == ("node-b", 42, True)
    h.beats[w] = beat(h, version=t.version or "")
    await h.tick(t)
    assert h.counts() == {S.RUNNING: 1} and h.store.records[w].version == t.version
    assert h.launcher.alive == {} and h.launcher.terminated == []
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.HEALTHY
    assert h.state.settled(t)


async def test_a_slow_loader_is_not_timed_out_while_it_heartbeats() -> None:
    h = Harness()
    t = external_target()
    w = worker(h)
    for _ in range(10):  # 10 minutes of loading, heartbeat kept fresh: start_timeout (60 s here) does not apply
        h.now += 60_000
        h.beats[w] = beat(h, ReplicaHealth.STARTING)
        await h.tick(t)
    assert h.counts() == {S.STARTING: 1}


async def test_an_expired_heartbeat_writes_the_worker_off() -> None:
    h, t, w = await one_running_worker()
    await h.tick(t, advance_ms=11_000)  # the worker's host died: no more beats
    assert w not in h.store.records and h.counts() == {}
    assert h.launcher.killed == []  # nothing to kill: not ours


async def test_a_worker_that_drains_and_says_goodbye_leaves_status() -> None:
    h, t, w = await one_running_worker()
    h.beats[w] = beat(h, ReplicaHealth.DRAINING)
    await h.tick(t)
    assert h.counts() == {S.STOPPING: 1}
    del h.beats[w]
    await h.tick(t)
    assert h.counts() == {}


async def test_a_stale_heartbeat_never_seen_alive_is_dropped_not_counted() -> None:
    h = Harness()
    t = external_target()
    w = worker(h)
    h.beats[w] = beat(h)
    h.now += 60_000
    await h.tick(t)
    assert h.counts() == {} and h.store.removed == [w]  # its beat is removed, so the reclaimer frees its work


async def test_a_worker_that_fails_to_load_says_why_in_the_deployments_health() -> None:
    """One hand-started worker refused its import: with none running, the deployment is not HEALTHY with an empty
    message (status and `streamserve health` said all was well); a worker that runs again settles it."""
    h, t = Harness(), external_target()
    h.beats[worker(h)] = beat(h, ReplicaHealth.FAILED, message="ConfigError: import_path 'm:os.system' is refused")
    await h.tick(t)
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UPDATING
    assert h.store.health.message == "ConfigError: import_path 'm:os.system' is refused"
    h.beats[worker(h)] = beat(h, version=t.version or "")
    await h.tick(t)
    await h.tick(t)
    assert h.counts() == {S.RUNNING: 1}
    assert h.store.health.health is DeploymentHealth.HEALTHY and h.store.health.message == ""


async def test_workers_that_fail_to_load_turn_the_deployment_unhealthy() -> None:
    h = Harness()
    t = external_target()
    for _ in range(UNHEALTHY_AFTER_FAILURES):
        w = worker(h)
        h.beats[w] = beat(h, ReplicaHealth.FAILED, message="ImportError: no module named 'model'")
        await h.tick(t)
        assert w not in h.beats  # the failed worker's record and beat are dropped
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UNHEALTHY
    assert "no module named" in h.store.health.message


async def test_a_new_version_is_settled_only_when_every_live_worker_runs_it() -> None:
    h = Harness()
    old, new = external_target("1"), external_target("2")
    a, b = worker(h), worker(h)
    h.beats[a] = beat(h, version=old.version or "")
    h.beats[b] = beat(h, version=old.version or "")
    await h.tick(old)
    await h.tick(old)
    assert h.state.settled(old) and not h.state.settled(new)
    # a re-executes on the new config as a new worker; b still runs the old one
    del h.beats[a]
    c = worker(h)
    h.beats[c] = beat(h, version=new.version or "")
    await h.tick(new)
    await h.tick(new)
    assert not h.state.settled(new)
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UPDATING
    del h.beats[b]
    await h.tick(new)
    assert h.state.settled(new)
    assert h.store.health.health.value == "HEALTHY"


async def test_switching_to_external_stops_the_schedulers_own_replicas() -> None:
    h = Harness()
    await bring_up(h, target(2))
    await h.tick(external_target())
    assert h.counts() == {S.STOPPING: 2} and len(h.launcher.terminated) == 2


async def test_a_heartbeat_under_a_name_that_is_no_replica_id_is_ignored() -> None:
    h = Harness()
    t = external_target()
    h.beats["junk"] = beat(h)
    h.beats["other#1234"] = beat(h)  # another deployment's id
    await h.tick(t)
    assert h.counts() == {}
