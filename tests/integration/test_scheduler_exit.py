"""A scheduler asked to exit mid-tick leaves the replicas serving unless told to stop them."""

from __future__ import annotations

import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.scheduler.scheduler import Scheduler
from streamserve.wire.messages import ReplicaRecord
from streamserve.wire.states import ACTIVE_REPLICA_STATES
from tests.harness.fake_launcher import FakeLauncher
from tests.integration.conftest import deploy


async def active_replicas(aredis: aioredis.Redis, settings: Settings) -> int:
    raw = await aredis.hgetall(settings.keys.replicas("rec"))
    return sum(ReplicaRecord.decode(v).state in ACTIVE_REPLICA_STATES for v in raw.values())


async def test_exit_signal_during_a_tick_does_not_retire_replicas(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, num_replicas=2)
    clock = [1_000_000]
    launcher = FakeLauncher()
    scheduler = Scheduler(settings, aredis, launcher, clock=lambda: clock[0])
    await scheduler.tick()
    assert await active_replicas(aredis, settings) == 2
    scheduler.should_exit.set()  # SIGTERM arrives; a tick still runs before the loop sees it
    clock[0] += 200
    await scheduler.tick()
    assert await active_replicas(aredis, settings) == 2  # the next scheduler adopts them
    assert launcher.terminated == []


async def test_up_s_scheduler_does_stop_them(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, num_replicas=2)
    clock = [1_000_000]
    scheduler = Scheduler(settings, aredis, FakeLauncher(), stop_replicas_on_exit=True, clock=lambda: clock[0])
    await scheduler.tick()
    scheduler.should_exit.set()
    clock[0] += 200
    await scheduler.tick()
    assert await active_replicas(aredis, settings) == 0
