"""A scheduler asked to exit mid-tick leaves the replicas serving; `up`'s scheduler, told to stop them, does so only
once its loop has seen the signal and its job workers are gone (their calls still need a replica: issue 26)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.scheduler.scheduler import Scheduler
from streamserve.wire.messages import ReplicaRecord
from streamserve.wire.states import ACTIVE_REPLICA_STATES
from tests.harness.fake_launcher import FakeLauncher
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import deploy


async def active_replicas(aredis: aioredis.Redis, settings: Settings) -> int:
    raw = await aredis.hgetall(settings.keys.replicas("rec"))
    return sum(ReplicaRecord.decode(v).state in ACTIVE_REPLICA_STATES for v in raw.values())


@pytest.mark.parametrize("stop_replicas_on_exit", [False, True])
async def test_exit_signal_during_a_tick_does_not_retire_replicas(
    settings: Settings, aredis: aioredis.Redis, stop_replicas_on_exit: bool
) -> None:
    await deploy(settings, num_replicas=2)
    clock = [1_000_000]
    launcher = FakeLauncher()
    scheduler = Scheduler(
        settings, aredis, launcher, stop_replicas_on_exit=stop_replicas_on_exit, clock=lambda: clock[0]
    )
    await scheduler.tick()
    assert await active_replicas(aredis, settings) == 2
    scheduler.should_exit.set()  # SIGTERM arrives; a tick still runs before the loop sees it
    clock[0] += 200
    await scheduler.tick()
    assert await active_replicas(aredis, settings) == 2  # still serving: for the job workers, or the next scheduler
    assert launcher.terminated == []


async def test_up_s_scheduler_does_stop_them_on_its_way_out(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, num_replicas=2, graceful_shutdown_timeout_s=0)
    scheduler = Scheduler(settings, aredis, FakeLauncher(), stop_replicas_on_exit=True)
    running = asyncio.create_task(scheduler.run())
    try:

        async def both_started() -> bool:
            return await active_replicas(aredis, settings) == 2

        await wait_for_async(both_started, 10, "the scheduler did not start the replicas")
    finally:
        scheduler.should_exit.set()
        await asyncio.wait_for(running, 10)
    assert await active_replicas(aredis, settings) == 0
