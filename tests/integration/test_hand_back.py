"""Requests read again after their replica died for the last time before the dead-letter stream (``attempts`` one
below max_delivery_attempts) run one at a time: a replica that reads several runs one and hands the others back to
the queue. Redis away at that moment (the hand-back's script fails)
ended the replica, which charged every request it held an attempt (dead-lettering them at max_delivery_attempts 1);
the hand-back is now tried again until Redis is back, and every request is answered by the replica that read it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.transport.streams import Requeuer
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Reply, Request, StreamBatches, now_ms
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

SUSPECTS = 3
LAST_CHANCE = DeploymentConfig.model_fields["max_delivery_attempts"].default - 1  # one more death dead-letters it


@pytest.mark.parametrize(
    "error",
    [
        RedisConnectionError("Connection closed by server (a test's)"),
        OutOfMemoryError("command not allowed when used memory > 'maxmemory' (a test's)"),
    ],
    ids=["redis-away", "redis-full"],
)
async def test_a_hand_back_that_meets_redis_away_is_tried_again_and_the_replica_serves_on(
    start_replica: StartReplica,
    settings: Settings,
    aredis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    await start_replica()
    failed: list[int] = []
    requeue = Requeuer.requeue

    async def away_once(self: Requeuer, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(1)
            raise error
        return await requeue(self, *args, **kwargs)

    monkeypatch.setattr(Requeuer, "requeue", away_once)
    replies = settings.keys.reply_stream("hand-back-test")
    stream = settings.keys.requests("rec")
    await aredis.xgroup_create(replies, "made", id="$", mkstream=True)  # (replicas add no reply to a stream gone)
    # Added in one step, so that the replica's one blocking read takes them all: it runs one and hands the rest back.
    async with aredis.pipeline(transaction=True) as pipe:
        for n in range(SUSPECTS):
            request = Request(
                f"suspect-{n}", replies, now_ms() + 30_000, str(n).encode(), attempts=LAST_CHANCE, tag=f"t{n}"
            )
            pipe.xadd(stream, dict(request.encode()))  # type: ignore[arg-type]
        await pipe.execute()

    seen: list[Any] = []

    async def answered() -> bool:
        seen[:] = [await aredis.xlen(replies), await aredis.xlen(stream), await aredis.xpending(stream, CONSUMER_GROUP)]
        return await aredis.xlen(replies) == SUSPECTS

    await wait_for_async(answered, 20, lambda: f"{SUSPECTS} suspects sent, not all answered: {seen}")
    read: StreamBatches = await aredis.xrange(replies)  # type: ignore[assignment]
    assert sorted(Reply.decode(fields).request_id for _id, fields in read) == [f"suspect-{n}" for n in range(SUSPECTS)]
    assert failed == [1]
    async with AsyncClient(settings=settings) as client:
        assert (await asyncio.wait_for(client.call("rec", 7), 10))["body"] == 7


@pytest.mark.parametrize("generator", ["count_to", "acount_to"])
async def test_a_stream_run_alone_whose_caller_reads_no_more_lets_the_replica_read_on(
    start_replica: StartReplica, settings: Settings, aredis: aioredis.Redis, generator: str
) -> None:
    """A suspect is run alone until it ends, unless it waits outside the replica: a stream whose caller keeps it open
    unread waits for that caller for as long as its deadline allows, and the replica read nothing else meanwhile."""
    await start_replica(
        import_path=f"tests.stream_deployments:{generator}",
        max_unread_chunks=2,
        max_ongoing_requests=4,
        graceful_shutdown_timeout_s=1,  # (the suspect, unread, would hold the drain)
    )
    replies = settings.keys.reply_stream("unread-test")
    await aredis.xgroup_create(replies, "made", id="$", mkstream=True)
    suspect = Request("suspect", replies, now_ms() + 60_000, b"1000", attempts=LAST_CHANCE, stream=True, tag="t0")
    await aredis.xadd(settings.keys.requests("rec"), dict(suspect.encode()))  # type: ignore[arg-type]

    async def paused() -> bool:  # its first chunks are sent, and nobody reads them
        return await aredis.xlen(replies) > 0

    await wait_for_async(paused, 10, "the suspect never started")
    async with AsyncClient(settings=settings) as client:

        async def chunks() -> list[Any]:
            return [chunk async for chunk in client.stream("rec", 3)]

        assert await asyncio.wait_for(chunks(), 10) == [{"i": 0}, {"i": 1}, {"i": 2}]
