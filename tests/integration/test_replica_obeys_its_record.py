"""A replica never serves a farm that does not count it: when its record in the deployment's replica hash says
stop, or was there and is gone, it drains and exits within a few heartbeats, on whatever host it runs."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import ReplicaRecord, Request, now_ms
from streamserve.wire.states import ReplicaState
from streamserve.workers.replica import Replica
from tests import deployments
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


async def test_a_replica_silent_past_half_the_heartbeat_timeout_asks_before_it_runs_what_it_reads(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    """Cut off from Redis (a network partition), a replica is written off and what it held is run elsewhere. What
    it reads once back, before its next beat would tell it, it must not run too: it beats first, learns it was
    written off, and hands the request back to the queue, unrun."""
    replica = await start_replica()
    await record(aredis, settings, replica, ReplicaState.RUNNING)
    assert not await exits(replica, within_s=1.0)
    replica._heartbeat._silent_limit = -1.0  # (as if no beat had landed since the cut, whatever the loop's beats do)
    await aredis.delete(settings.keys.replicas("rec"))  # written off meanwhile
    request = Request("after-the-cut", settings.keys.reply_stream("cut"), now_ms() + 30_000, b'"after the cut"')
    await aredis.xadd(settings.keys.requests("rec"), dict(request.encode()))  # type: ignore[arg-type]
    assert await exits(replica), "the written-off replica kept serving"

    async def handed_back() -> bool:
        return int((await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP))["pending"]) == 0

    await wait_for_async(handed_back, 5, "the request read after the cut was not handed back")
    assert "after the cut" not in deployments.CALLS
    [(_id, fields)] = await aredis.xrange(settings.keys.requests("rec"))
    assert fields[b"id"] == b"after-the-cut"


async def test_a_silent_replica_whose_beat_redis_refuses_for_memory_runs_what_it_read(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    """Redis full refuses the beat, and the scheduler's writes too (none can write the replica off): the replica runs
    what it read, as it would have without a beat, and its reply lands once Redis has room again."""
    replica = await start_replica()
    replica._heartbeat._silent_limit = -1.0  # (every read asks for a beat first)
    replies = settings.keys.reply_stream("full")
    await aredis.xgroup_create(replies, "made", id="$", mkstream=True)  # (replicas add no reply to a stream gone)
    request = Request("while-full", replies, now_ms() + 30_000, b'"while full"', tag="t1")
    [(_, limit)] = (await aredis.config_get("maxmemory")).items()
    try:
        async with aredis.pipeline(transaction=True) as pipe:  # full from the moment the replica reads it
            pipe.xadd(settings.keys.requests("rec"), dict(request.encode()))  # type: ignore[arg-type]
            pipe.config_set("maxmemory", 1)
            await pipe.execute()
        await wait_for_async(
            lambda: "while full" in deployments.CALLS, 10, "what it read while Redis was full never ran"
        )
    finally:
        await aredis.config_set("maxmemory", limit)

    async def answered() -> bool:
        return bool(await aredis.xlen(replies) == 1)

    await wait_for_async(answered, 10, "its reply never landed")
