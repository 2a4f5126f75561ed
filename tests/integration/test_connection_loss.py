"""Calls go through again after Redis drops every connection (a network blip, a proxy restart, a failover)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from streamserve.client import AsyncClient
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
