"""GPUs and other resources: each replica that asks for GPUs gets devices of its own, or waits for them."""

from __future__ import annotations

import pytest

from streamserve.control.resources import GpuAllocator, host_gpus, overcommit
from streamserve.scheduler.deployment_state import DeploymentState
from streamserve.scheduler.types import Timeouts
from streamserve.wire.config import DeploymentConfig, parse_config
from streamserve.wire.errors import ConfigError
from streamserve.wire.messages import ReplicaRecord
from streamserve.wire.states import DeploymentHealth, ReplicaState
from tests.unit.test_deployment_state import Harness, bring_up, target

S = ReplicaState


def with_gpus(devices: tuple[str, ...]) -> Harness:
    h = Harness()
    h.state = DeploymentState("echo", h.launcher, h.store, Timeouts(10_000, 60_000), GpuAllocator(devices))
    return h


def test_declared_gpus_win_over_nvidia_smi() -> None:
    assert host_gpus("0,1,2,3") == ("0", "1", "2", "3")
    assert host_gpus("") == ()


async def test_each_replica_gets_devices_of_its_own() -> None:
    h = with_gpus(("0", "1", "2", "3"))
    await bring_up(h, target(2, resources={"gpus": 2}))
    given = [h.launcher.gpus[r.pid] for r in h.by_state(S.RUNNING)]
    assert sorted(given) == [("0", "1"), ("2", "3")]
    assert sorted(tuple(r.gpus) for r in h.store.records.values()) == sorted(given)  # status shows them


async def test_a_deployment_no_replica_of_which_fits_the_host_is_unhealthy() -> None:
    """More GPUs a replica than the host has: nothing will ever serve it here, so it is UNHEALTHY (its callers get
    503 at once) with the reason, not UPDATING for ever (callers waiting out their deadlines). One that some of its
    replicas fit serves with those."""
    h = with_gpus(())
    await h.tick(target(1, resources={"gpus": 1}))
    await h.tick(target(1, resources={"gpus": 1}))
    assert h.store.health is not None and h.store.health.health is DeploymentHealth.UNHEALTHY
    assert h.store.health.message == "1 replica(s) x 1 GPU(s) do not fit the 0 GPU(s) of this host"
    some = with_gpus(("0",))
    await bring_up(some, target(2, resources={"gpus": 1}))
    assert some.store.health is not None and some.store.health.health is DeploymentHealth.UPDATING
    assert some.counts() == {S.RUNNING: 1, S.SHOULD_START: 1}


async def test_a_replica_without_free_gpus_waits_and_says_why() -> None:
    h = with_gpus(("0", "1", "2", "3"))
    t = target(5, resources={"gpus": 1})
    await bring_up(h, t)
    assert h.counts() == {S.RUNNING: 4, S.SHOULD_START: 1}
    [waiting] = h.by_state(S.SHOULD_START)
    assert waiting.message == "needs 1 GPU, 0 free of 4"
    assert h.store.health is not None and h.store.health.message == "needs 1 GPU, 0 free of 4"
    assert len(h.launcher.alive) == 4  # never started without its GPU
    # One dies: its device is free again, and the waiting replica gets it.
    victim = h.by_state(S.RUNNING)[0]
    h.launcher.exit(victim.pid)
    await h.tick(t)
    await h.tick(t)
    started = [r for r in h.by_state(S.STARTING)]
    assert len(started) == 1 and started[0].gpus == h.store.records[started[0].replica_id].gpus
    assert set(started[0].gpus) == set(h.launcher.gpus[victim.pid])


async def test_no_gpus_on_the_host_means_it_never_starts() -> None:
    h = with_gpus(())
    await h.tick(target(1, resources={"gpus": 1}))
    await h.tick(target(1, resources={"gpus": 1}))
    assert h.counts() == {S.SHOULD_START: 1} and h.launcher.alive == {}
    assert h.by_state(S.SHOULD_START)[0].message == "needs 1 GPU, 0 free of 0"


async def test_a_new_scheduler_keeps_the_devices_running_replicas_hold() -> None:
    h = with_gpus(("0", "1"))
    t = target(1, resources={"gpus": 1})
    await bring_up(h, t)
    held = h.by_state(S.RUNNING)[0].gpus
    fresh = DeploymentState("echo", h.launcher, h.store, Timeouts(10_000, 60_000), GpuAllocator(("0", "1")))
    for record in list(h.store.records.values()):
        fresh.adopt(ReplicaRecord.model_validate(record.model_dump()))
    h.state = fresh
    await h.tick(target(2, resources={"gpus": 1}))
    new = h.by_state(S.STARTING)
    assert len(new) == 1 and set(new[0].gpus).isdisjoint(held)


def test_replicas_that_ask_for_no_gpus_are_not_given_any() -> None:
    allocator = GpuAllocator(("0",))
    assert allocator.take("a", 0) == ()
    assert allocator.free() == ["0"]


def deployment(**fields: object) -> DeploymentConfig:
    return DeploymentConfig.model_validate({"name": "d", "import_path": "m:f", **fields})


def test_asking_for_more_cpus_or_memory_than_the_host_has_is_warned() -> None:
    fits = [deployment(num_replicas=2, resources={"cpus": 1, "memory": "1Gi"})]
    assert overcommit(fits, cpus=2, memory_bytes=4 * 2**30) == []
    too_many = [
        deployment(num_replicas=2, resources={"cpus": 1.5}),
        deployment(name="e", autoscaling_config={"min_replicas": 0, "max_replicas": 3}, resources={"memory": "2Gi"}),
    ]
    assert overcommit(too_many, cpus=2, memory_bytes=4 * 2**30) == [
        "the replicas ask for 3 CPUs in all, and this host has 2",
        "the replicas ask for 6.0 GiB of memory in all, and this host has 4.0 GiB",
    ]
    elsewhere = [deployment(external_scaler_enabled=True, resources={"cpus": 64})]
    assert overcommit(elsewhere, cpus=2, memory_bytes=2**30) == []


@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({"cpus": -1}, "resources.cpus: Input should be greater than or equal to 0"),
        ({"cpus": "lots"}, "resources.cpus: Input should be a valid number"),
        ({"gpus": 0.5}, "resources.gpus: Input should be a valid integer"),
        ({"gpus": -2}, "resources.gpus: Input should be greater than or equal to 0"),
        ({"memory": "2GB"}, "resources.memory: '2GB' is not a memory size"),
        ({"memory": -5}, "resources.memory: -5 is not a memory size"),
        ({"disks": 1}, "resources.disks: unknown field"),
    ],
)
def test_bad_resources_name_the_field(resources: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match="deployment 'd'") as raised:
        parse_config({"deployments": [{"name": "d", "import_path": "m:f", "resources": resources}]})
    assert error in str(raised.value)


async def test_a_new_version_rolls_on_a_host_whose_gpus_are_all_taken() -> None:
    h = with_gpus(("0", "1"))
    await bring_up(h, target(2, version="1", resources={"gpus": 1}))
    new = target(2, version="2", resources={"gpus": 1})
    for _ in range(20):  # old replicas give their devices up one at a time; each replacement gets one
        await h.tick(new)
        h.beat_all()
        for record in h.by_state(S.STOPPING):
            h.launcher.exit(record.pid)
        if h.state.settled(new):
            break
    assert h.state.settled(new)
    assert sorted(d for r in h.by_state(S.RUNNING) for d in r.gpus) == ["0", "1"]


@pytest.mark.parametrize("devices", [(), ("0",)])
async def test_an_update_to_gpus_the_old_replicas_do_not_hold_stops_none_of_them(devices: tuple[str, ...]) -> None:
    """The new version waits for GPUs (the host has none, or fewer than it asks for); the old replicas, which hold
    none, serve on: stopping them would free nothing for it."""
    h = with_gpus(devices)
    await bring_up(h, target(2, version="1"))
    old = {r.replica_id for r in h.by_state(S.RUNNING)}
    new = target(2, version="2", resources={"gpus": 2})
    for _ in range(10):
        await h.tick(new)
        h.beat_all()
    assert {r.replica_id for r in h.by_state(S.RUNNING)} == old
    assert h.counts() == {S.RUNNING: 2, S.SHOULD_START: 2}


async def test_more_gpus_than_the_host_has_is_unschedulable() -> None:
    h = with_gpus(("0", "1"))
    await h.tick(target(3, resources={"gpus": 1}))
    assert h.state.unschedulable == "3 replica(s) x 1 GPU(s) do not fit the 2 GPU(s) of this host"
    await h.tick(target(2, resources={"gpus": 1}))
    assert h.state.unschedulable == ""
