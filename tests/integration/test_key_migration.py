"""A farm kept by an older release (farm-wide keys without the ``{prefix}`` hash tag) comes back whole on upgrade."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from streamserve.control.desired_state import DesiredState
from streamserve.runtime.settings import Settings
from streamserve.scheduler.scheduler import Scheduler
from tests.harness.fake_launcher import FakeLauncher
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import deploy


async def test_the_scheduler_renames_an_old_farms_keys_and_serves_its_deployments(
    settings: Settings, aredis: aioredis.Redis
) -> None:
    await deploy(settings, num_replicas=1)
    # What the release before the hash tag left in Redis: the same hashes under the old names.
    for old, new in settings.keys.legacy_farm_keys().items():
        if await aredis.exists(new):
            await aredis.rename(new, old)
    assert await aredis.exists("streamserve:deployments")
    assert not await aredis.exists(settings.keys.deployments())

    launcher = FakeLauncher()
    scheduler = Scheduler(settings, aredis, launcher)
    running = asyncio.create_task(scheduler.run())
    try:
        # Its replica is started, as before the upgrade (waited for, not looked at after the first tick: on a busy
        # host the first tick may end before the launch it asked for).
        await wait_for_async(lambda: len(launcher.alive) == 1, 10, lambda: f"replicas started: {launcher.alive}")
    finally:
        scheduler.should_exit.set()
        await asyncio.wait_for(running, 10)
    assert not await aredis.exists("streamserve:deployments")
    assert (await DesiredState(aredis, settings.keys).get("rec")).num_replicas == 1
