"""Calls go through again after Redis drops every connection (a network blip, a proxy restart, a failover)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
import uvloop
from redis.exceptions import ClusterDownError, MasterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.transport.pipelining import Pipeliner
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Request, now_ms
from streamserve.workers.serving import Serving
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica


async def drop_every_connection_but_this_one(aredis: aioredis.Redis) -> int:
    """The caller's and the replica's kept connections, the pooled ones, the pub/sub ones: how many went."""
    killed = 0
    for kind in ("normal", "pubsub"):
        killed += await aredis.execute_command("CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes")
    return killed


async def test_calls_succeed_after_redis_drops_every_connection(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis
) -> None:
    await start_replica()
    assert (await client.call("rec", 0))["body"] == 0
    for blip in range(1, 4):
        assert await drop_every_connection_but_this_one(aredis) >= 4
        assert (await client.call("rec", {"after": blip}, timeout=10))["body"] == {"after": blip}
        answers = await asyncio.gather(*(client.call("rec", i, timeout=10) for i in range(50)))
        assert [answer["body"] for answer in answers] == list(range(50))


async def test_a_request_delivered_by_a_read_lost_with_its_connection_is_still_run(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    """Redis delivered an entry to the replica (it is pending under its name) but the reply to that read never
    reached it: the connection went. Nobody else will ever run such an entry, so the replica must, once it is back."""
    replica = await start_replica()
    requests, replies = settings.keys.requests("rec"), settings.keys.reply_stream("lost-read")
    await aredis.xadd(replies, {"hello": "lost-read"})
    request = Request("lost-1", replies, now_ms() + 60_000, b'"lost"')
    async with aredis.pipeline(transaction=True) as tx:
        # Atomically: queued and delivered to the replica's name before its own blocked read can see it.
        tx.xadd(requests, dict(request.encode()))
        tx.xreadgroup(CONSUMER_GROUP, replica.replica_id.to_str(), {requests: ">"}, count=1)
        _entry_id, [[_stream, delivered]] = await tx.execute()
    assert len(delivered) == 1
    assert await drop_every_connection_but_this_one(aredis) >= 1

    async def answered() -> list[bytes]:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await aredis.xrange(replies))
        return [fields.get(b"id", b"") for _id, fields in entries]

    async def lost_one_answered() -> bool:
        return b"lost-1" in await answered()

    await wait_for_async(lost_one_answered, 10, "the delivered request was never run", interval_s=0.05)
    pending = await aredis.xpending(requests, CONSUMER_GROUP)
    assert pending["pending"] == 0


def test_a_write_to_a_socket_redis_closed_is_retried_on_uvloop(redis_url: str) -> None:
    """On uvloop (what every process runs on) a write to a transport closed under the connection raises
    RuntimeError, not a connection error: a Redis killed at that moment answered the gateway's caller 500. It must
    count as a lost connection, which the retry policy sends again on a new one."""

    async def scenario() -> None:
        client = async_redis(redis_url)
        pipeliner = Pipeliner(client)
        try:
            assert await pipeliner.execute(("PING",)) == [b"PONG"]
            kept = cast(Any, pipeliner)._kept  # the connection the next round trip writes to
            kept._writer.transport.abort()  # closed under it, as when Redis dies mid-write
            await asyncio.sleep(0)
            assert await pipeliner.execute(("PING",)) == [b"PONG"]
            # A connection taken from the pool and written to directly says the same.
            lost = await client.connection_pool.get_connection()
            lost._writer.transport.abort()
            await asyncio.sleep(0)
            with pytest.raises(RedisConnectionError):
                await lost.send_packed_command(b"*1\r\n$4\r\nPING\r\n", check_health=False)
            await client.connection_pool.release(lost)
        finally:
            await pipeliner.aclose()
            await client.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


async def test_a_read_refused_by_a_cluster_failing_over_is_tried_again(
    start_replica: StartReplica, client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis Cluster failing over refuses commands (CLUSTERDOWN, TRYAGAIN, ...) for longer than its routing tries
    them; redis-py raises those refusals as ResponseErrors. The replica's read loop backs off and reads again, as
    after a lost connection, instead of taking them for a failed command and exiting."""
    refusals: list[Exception] = [
        ClusterDownError("The cluster is down"),
        TryAgainError("Multiple keys request during rehashing of slot"),
        MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    ]
    read = Serving._read

    async def refused_at_first(self: Serving, free: int) -> Any:
        if refusals:
            raise refusals.pop(0)
        return await read(self, free)

    monkeypatch.setattr(Serving, "_read", refused_at_first)
    await start_replica()
    assert (await client.call("rec", "after the failover", timeout=5))["body"] == "after the failover"
    assert refusals == []
