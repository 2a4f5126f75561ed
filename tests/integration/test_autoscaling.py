"""Autoscaling against a real redis-server: scale-from-zero requests wait; a new scheduler resumes the decided count;
short requests between ticks are seen; a scale-down knows what each replica holds."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.control.goal_records import GoalStore
from streamserve.control.heartbeats import queue_beats
from streamserve.control.status import StatusReader
from streamserve.runtime.settings import Settings
from streamserve.scheduler.scheduler import Scheduler
from streamserve.scheduler.store import RedisReplicaStore
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import AutoscaleRecord, Heartbeat, ReplicaRecord, Request, now_ms
from streamserve.wire.priorities import PRIORITIES, Priority
from streamserve.wire.states import ACTIVE_REPLICA_STATES, ReplicaHealth, ReplicaState
from tests.harness.fake_launcher import FakeLauncher
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy

MIN_ZERO = {"min_replicas": 0, "max_replicas": 3, "target_ongoing_requests": 1, "upscale_delay_s": 0}


async def test_request_to_an_idle_autoscaled_deployment_waits_for_its_first_replica(
    start_replica: StartReplica, client: AsyncClient, settings: Settings, aredis: aioredis.Redis
) -> None:
    fields = {"autoscaling_config": MIN_ZERO}
    await deploy(settings, **fields)
    call = asyncio.create_task(client.call("rec", {"x": 1}, timeout=20))  # not refused: it queues

    async def queued() -> bool:
        return int(await aredis.xlen(settings.keys.requests("rec"))) == 1

    await wait_for_async(queued, 10)
    await start_replica(**fields)  # the replica that starts later finds the request already queued
    assert (await asyncio.wait_for(call, 20))["body"] == {"x": 1}


async def test_a_new_scheduler_resumes_the_autoscaled_count(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, autoscaling_config={**MIN_ZERO, "downscale_delay_s": 600})
    stream = settings.keys.requests("rec")
    for i in range(3):
        await aredis.xadd(stream, Request(f"r{i}", "", now_ms() + 60_000, b"null").encode())
    clock = [1_000_000]
    launcher = FakeLauncher()  # no process is started: the replicas are records with made-up pids
    first = Scheduler(settings, aredis, launcher, clock=lambda: clock[0])
    for _ in range(2):  # 0 -> 1 at once for the queued requests, then 1 -> 3 for 3 ongoing
        clock[0] += 200
        await first.tick()
    status = {s.name: s for s in await StatusReader(aredis, settings.keys).status()}["rec"]
    assert status.target == 3 and status.starting == 3
    assert status.autoscaling is not None and "ongoing 3.0 on 1 replica(s)" in status.autoscaling.reason

    # The first scheduler is gone; one of its replicas died meanwhile, its record with it (so that what runs, 2, is
    # not the count decided, 3), and the queue drained.
    records = [ReplicaRecord.decode(v) for v in (await aredis.hgetall(settings.keys.replicas("rec"))).values()]
    dead = records[0]
    launcher.exit(dead.pid)
    assert await aredis.hdel(settings.keys.replicas("rec"), dead.replica_id) == 1
    await aredis.xtrim(stream, maxlen=0)
    second = Scheduler(settings, aredis, launcher, clock=lambda: clock[0])
    running = asyncio.create_task(second.run())

    async def active() -> set[str]:
        values = (await aredis.hgetall(settings.keys.replicas("rec"))).values()
        return {r.replica_id for r in map(ReplicaRecord.decode, values) if r.state in ACTIVE_REPLICA_STATES}

    async def replaced() -> bool:
        # Not "two ticks": a stop cuts the tick in progress short, between the dead one written off and its successor.
        now = await active()
        return len(now) == 3 and dead.replica_id not in now

    try:
        await wait_for_async(replaced, 10, lambda: f"the dead replica was not replaced: {second.ticks} ticks")
    finally:
        second.should_exit.set()
        await asyncio.wait_for(running, 10)
    assert len(await active()) == 3  # the dead one replaced, not dropped, and nothing more
    status = {s.name: s for s in await StatusReader(aredis, settings.keys).status()}["rec"]
    assert status.target == 3


async def test_the_progress_of_turning_autoscaling_on_counts_from_what_runs(
    settings: Settings, aredis: aioredis.Redis
) -> None:
    """`scale echo 2`, then a deploy with autoscaling back on: until the scheduler writes its first count (what
    runs, within the bounds), the progress line counts from what runs too; it said "scaling down to 0"."""
    cfg = await deploy(settings, num_replicas=2)
    for i in range(2):
        record = ReplicaRecord(
            replica_id=f"rec#{i:08x}",
            state=ReplicaState.RUNNING,
            version=cfg.code_version(),
            created_ms=1,
            updated_ms=1,
        )
        await aredis.hset(settings.keys.replicas("rec"), record.replica_id, record.encode())
    auto = DeploymentConfig.model_validate({**cfg.model_dump(), "num_replicas": None, "autoscaling_config": MIN_ZERO})
    applied = await DesiredState(aredis, settings.keys).apply(AppConfig(deployments=[auto]))
    goal = await GoalStore(aredis, settings.keys).get(applied.goals["rec"])
    line = await StatusReader(aredis, settings.keys).progress(goal)
    assert line == f"rec: 2/2 replica(s) of version {goal.version} running", line
    # A replica of another version (an older one, or one of a failed update that this deploy undoes) still up.
    other = ReplicaRecord(
        replica_id="rec#000000ff", state=ReplicaState.STOPPING, version="f00d", created_ms=1, updated_ms=1
    )
    await aredis.hset(settings.keys.replicas("rec"), other.replica_id, other.encode())
    line = await StatusReader(aredis, settings.keys).progress(goal)
    assert line == f"rec: 2/2 replica(s) of version {goal.version} running, 1 of another version starting or stopping"
    # One running is said apart from those starting or stopping (they were all "still up": found by an outside tester).
    old = ReplicaRecord(
        replica_id="rec#000000fd", state=ReplicaState.RUNNING, version="f00d", created_ms=1, updated_ms=1
    )
    await aredis.hset(settings.keys.replicas("rec"), old.replica_id, old.encode())
    line = await StatusReader(aredis, settings.keys).progress(goal)
    assert line.endswith(", 1 of another version still running, 1 of another version starting or stopping"), line
    # One of another version that never started (a failed update's, waiting its turn) is not up: not counted.
    never = ReplicaRecord(
        replica_id="rec#000000fe", state=ReplicaState.SHOULD_START, version="f00d", created_ms=1, updated_ms=1
    )
    await aredis.hset(settings.keys.replicas("rec"), never.replica_id, never.encode())
    line = await StatusReader(aredis, settings.keys).progress(goal)
    assert line.endswith(", 1 of another version still running, 1 of another version starting or stopping"), line


async def test_short_requests_between_ticks_keep_the_replica_until_they_stop(
    settings: Settings, aredis: aioredis.Redis
) -> None:
    """A request every 1.5 s that a replica reads and finishes between two ticks is in no tick's XLEN: the request
    streams' last-delivered ids tell the scheduler it came. The deployment keeps its replica for as long as they come
    (it went 1 -> 0 after 30 s, and the next caller had a cold start), and goes to 0 once they stop."""
    await deploy(settings, autoscaling_config={**MIN_ZERO, "max_replicas": 2, "downscale_delay_s": 10})
    clock = [1_000_000]
    scheduler = Scheduler(settings, aredis, FakeLauncher(), clock=lambda: clock[0])

    async def tick() -> int:
        clock[0] += 200
        await scheduler.tick()
        record = await aredis.hget(settings.keys.autoscaling(), "rec")
        return AutoscaleRecord.decode(record).replicas if record is not None else 0

    async def serve(priority: Priority) -> None:
        """What a replica does with a short request: read, run, acknowledge and delete, all between two ticks."""
        stream = settings.keys.requests("rec", priority)
        await aredis.xadd(stream, Request("r", "", now_ms() + 60_000, b"null").encode())
        [[_, [(entry_id, _)]]] = await aredis.xreadgroup(CONSUMER_GROUP, "rec#00000001", {stream: ">"}, count=1)
        await aredis.xack(stream, CONSUMER_GROUP, entry_id)
        await aredis.xdel(stream, entry_id)

    assert await tick() == 0
    await aredis.xadd(settings.keys.requests("rec"), Request("first", "", now_ms() + 60_000, b"null").encode())
    assert await tick() == 1  # a request waits: 0 -> 1 at once
    await aredis.xtrim(settings.keys.requests("rec"), maxlen=0)
    levels = list(PRIORITIES)
    for i in range(45 * 5):
        if i % 15 in (0, 7):
            await serve(levels[i % len(levels)])
        assert await tick() == 1, f"scaled to zero after {i / 5:.1f} s of a request every 1.5 s"
    quiet_ticks = 0
    while await tick() == 1:
        quiet_ticks += 1
        assert quiet_ticks < 15 * 5, "not scaled to zero once the requests stopped"
    assert quiet_ticks >= 10 * 5


async def test_the_store_reads_what_each_replica_holds_from_its_last_heartbeat(
    settings: Settings, aredis: aioredis.Redis
) -> None:
    """What a scale-down orders replicas by (the fewest held stop first): the count is in every beat, news or not."""
    beats = {
        rid: (now_ms(), Heartbeat(ts_ms=now_ms(), health=ReplicaHealth.READY, pid=1, host="h", ongoing=n).encode())
        for rid, n in (("rec#00000001", 0), ("rec#00000002", 3))
    }
    async with aredis.pipeline(transaction=True) as pipe:
        queue_beats(pipe, settings.keys, "rec", beats, news=False)
        await pipe.execute()
    await aredis.hset(settings.keys.heartbeats("rec"), "rec#00000003", b"not a heartbeat")
    held = await RedisReplicaStore(aredis, settings.keys).held(
        "rec", ["rec#00000001", "rec#00000002", "rec#00000003", "rec#00000004"]
    )
    assert held == {"rec#00000001": 0, "rec#00000002": 3, "rec#00000003": 0, "rec#00000004": 0}
