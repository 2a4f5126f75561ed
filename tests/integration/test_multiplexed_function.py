"""A function deployment whose body calls a module-level ``@streamserve.multiplexed`` loader multiplexes as a class
with one does: a request naming no model is answered 400 before it runs (it was a handler error, 500), and the
replica says which models it holds (so requests are routed to it). A function beside the loader that does not call
it is a deployment like any other."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import BadRequestError
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica


async def test_a_function_calling_a_module_level_loader_multiplexes(
    start_replica: StartReplica, settings: Settings, aredis: aioredis.Redis
) -> None:
    replica = await start_replica(name="mux-function", import_path="tests.multiplex_functions:forecast")
    async with AsyncClient(settings=settings) as client:
        with pytest.raises(BadRequestError, match="X-Model-Id"):
            await asyncio.wait_for(client.call("mux-function", {"days": 2}), 10)
        answer = await asyncio.wait_for(client.call("mux-function", {"days": 2}, model_id="store-1"), 10)
        assert answer["store"] == "store-1" and answer["days"] == 2
    holders = settings.keys.model_holders("mux-function", "store-1")

    async def held() -> bool:
        return replica.replica_id.to_str().encode() in await aredis.zrange(holders, 0, -1)

    await wait_for_async(held, 10, "the replica never said it holds store-1")


async def test_a_function_beside_the_loader_needs_no_model(start_replica: StartReplica, settings: Settings) -> None:
    """It runs as without a model id when a request names one (its handler saw the id: found by an outside tester)."""
    await start_replica(name="plain-beside", import_path="tests.multiplex_functions:unmultiplexed")
    async with AsyncClient(settings=settings) as client:
        assert await asyncio.wait_for(client.call("plain-beside", {"x": 1}), 10) == {"body": {"x": 1}, "model": ""}
        named = client.call("plain-beside", {"x": 2}, model_id="store-1")
        assert await asyncio.wait_for(named, 10) == {"body": {"x": 2}, "model": ""}
