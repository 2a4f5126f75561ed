"""A replica never serves a farm that does not count it: when its record in the deployment's replica hash says
stop, or was there and is gone, it drains and exits within a few heartbeats, on whatever host it runs."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.wire.messages import ReplicaRecord, now_ms
from streamserve.wire.states import ReplicaState
from streamserve.workers.replica import Replica
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica


async def record(aredis: aioredis.Redis, settings: Settings, replica: Replica, state: ReplicaState) -> None:
    rec = ReplicaRecord(
        replica_id=replica.replica_id.to_str(), state=state, version="v", created_ms=now_ms(), updated_ms=now_ms()
    )
    await aredis.hset(settings.keys.replicas("rec"), rec.replica_id, rec.encode())


async def exits(replica: Replica, within_s: float = 5.0) -> bool:
    """Whether the replica stops reading within ``within_s`` (its run() then drains and returns)."""
    try:
        await wait_for_async(lambda: replica.stopping, within_s, interval_s=0.05)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("state", [ReplicaState.SHOULD_STOP, ReplicaState.STOPPING])
async def test_a_record_that_says_stop_is_obeyed(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings, state: ReplicaState
) -> None:
    replica = await start_replica()
    await record(aredis, settings, replica, ReplicaState.RUNNING)
    assert not await exits(replica, within_s=1.0)  # counted and wanted: it serves on
    await record(aredis, settings, replica, state)
    assert await exits(replica), "the replica kept serving a farm that retired it"


async def test_a_record_that_vanishes_means_no_farm_counts_it(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    replica = await start_replica()
    await record(aredis, settings, replica, ReplicaState.RUNNING)
    assert not await exits(replica, within_s=1.0)
    await aredis.delete(settings.keys.replicas("rec"))  # e.g. a new farm on an empty Redis
    assert await exits(replica), "the replica kept serving with no record"


async def test_a_replica_never_recorded_serves_on(start_replica: StartReplica) -> None:
    """No scheduler runs (or none has looked yet): nothing says stop."""
    replica = await start_replica()
    assert not await exits(replica, within_s=1.5)
