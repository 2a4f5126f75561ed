"""A reply made while a reconfigure() runs is kept under no config's response-cache entry: its handler may see the new
user_config's state (a reconfigure that takes it at once) while the replica still counts the old one as applied, and
a caller a moment behind the deploy asks under the old one's digest. Such replies were kept there, and a rollback to
that config then served them as hits (found by an outside tester, 3 rounds in 8)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig, ResponseCacheConfig
from streamserve.wire.response_cache import cache_digest
from tests import reconfigure_deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy

NAME = "reconfigured"
FIELDS: dict[str, Any] = {
    "name": NAME,
    "import_path": "tests.reconfigure_deployments:TakesItAtOnce",
    "response_cache": ResponseCacheConfig(),
}


async def test_a_reply_made_during_a_reconfigure_is_kept_under_no_configs_entry(
    start_replica: StartReplica, settings: Settings, aredis: aioredis.Redis
) -> None:
    reconfigure_deployments.BEGUN.clear()
    reconfigure_deployments.RELEASE.clear()
    await start_replica(**FIELDS, user_config={"v": 1})
    old = DeploymentConfig.model_validate({**FIELDS, "user_config": {"v": 1}})
    async with AsyncClient(settings=settings) as behind:
        assert (await asyncio.wait_for(behind.call(NAME, "warm"), 10))["v"] == 1
        assert behind._routes is not None

        async def unheard(_changed: object) -> None:  # this caller stays a moment behind the deploy
            return None

        behind._routes._longpoll._on_change = unheard
        try:
            await deploy(settings, **FIELDS, user_config={"v": 2, "hold": True})
            await wait_for_async(
                lambda: asyncio.sleep(0, reconfigure_deployments.BEGUN.is_set()), 10, "the reconfigure never began"
            )
            answer = await asyncio.wait_for(behind.call(NAME, "asked under v1"), 10)
            assert answer["v"] == 2  # the state is the new config's already
        finally:
            reconfigure_deployments.RELEASE.set()
    entry = settings.keys.cache_entry(NAME, cache_digest(old, "", orjson.dumps("asked under v1")))
    assert not await aredis.exists(entry), await aredis.hgetall(entry)


async def test_a_client_calls_by_the_config_it_has_just_deployed(
    start_replica: StartReplica, settings: Settings
) -> None:
    """Not by the one before until its long poll hears of the change: the first call after a deploy that changed the
    user_config was answered from the old config's cache entry about half the time."""
    reconfigure_deployments.RUNS.clear()
    await start_replica(**FIELDS, user_config={"v": 1})
    async with AsyncClient(settings=settings) as client:
        for _ in range(2):  # a run, then a hit
            assert (await asyncio.wait_for(client.call(NAME, "same"), 10))["v"] == 1
        assert reconfigure_deployments.RUNS == ["same"]
        assert client._routes is not None

        async def unheard(_message: str) -> None:  # it hears of no change by itself from here on
            return None

        client._routes._longpoll._heard = unheard  # type: ignore[method-assign]
        await client.deploy(
            AppConfig(deployments=[DeploymentConfig.model_validate({**FIELDS, "user_config": {"v": 2}})])
        )
        await asyncio.wait_for(client.call(NAME, "same"), 10)
        assert reconfigure_deployments.RUNS == ["same", "same"]  # asked under the new config: not the old entry
