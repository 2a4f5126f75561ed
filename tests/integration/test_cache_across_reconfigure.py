"""A reply made while a reconfigure() runs is kept under no config's response-cache entry: its handler may see the new
user_config's state (a reconfigure that takes it at once) while the replica still counts the old one as applied, and
a caller a moment behind the deploy asks under the old one's digest. Such replies were kept there, and a rollback to
that config then served them as hits (found by an outside tester, 3 rounds in 8)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import redis.asyncio as aioredis
from pydantic import SecretStr

from streamserve.app.gateway import create_app
from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig, ResponseCacheConfig
from streamserve.wire.response_cache import cache_digest
from tests import reconfigure_deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import TEST_API_KEY, StartReplica, deploy

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
        deaf_to_changes(client)
        await client.deploy(
            AppConfig(deployments=[DeploymentConfig.model_validate({**FIELDS, "user_config": {"v": 2}})])
        )
        await asyncio.wait_for(client.call(NAME, "same"), 10)
        assert reconfigure_deployments.RUNS == ["same", "same"]  # asked under the new config: not the old entry


async def test_the_gateway_calls_by_the_config_its_admin_api_has_just_deployed(
    start_replica: StartReplica, settings: Settings
) -> None:
    """The same through the gateway: ``POST /-/deploy``, then a call to that gateway."""
    reconfigure_deployments.RUNS.clear()
    await start_replica(**FIELDS, user_config={"v": 1})
    settings = settings.model_copy(update={"api_key": SecretStr(TEST_API_KEY)})
    app = create_app(settings)
    await app.gateway.client.start()
    headers = {"Authorization": f"Bearer {TEST_API_KEY}"}
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=headers) as http:
            for _ in range(2):  # a run, then a hit
                answer = await http.post(f"/{NAME}", json="same")
                assert answer.status_code == 200 and answer.json()["v"] == 1, answer.text
            assert reconfigure_deployments.RUNS == ["same"]
            deaf_to_changes(app.gateway.client)
            new = DeploymentConfig.model_validate({**FIELDS, "user_config": {"v": 2}})
            deployed = await http.post("/-/deploy", json={"deployments": [new.model_dump(mode="json")]})
            assert deployed.status_code == 200, deployed.text
            assert (await http.post(f"/{NAME}", json="same")).status_code == 200
            assert reconfigure_deployments.RUNS == ["same", "same"]  # asked under the new config: not the old entry
    finally:
        await app.gateway.client.aclose()


def deaf_to_changes(client: AsyncClient) -> None:
    """From here on ``client`` hears of no config change by itself (its long poll's messages go nowhere)."""
    assert client._routes is not None
    longpoll = client._routes._longpoll
    assert hasattr(longpoll, "_heard")  # (what is patched: renamed, the patch would silently do nothing)

    async def unheard(_message: str) -> None:
        return None

    longpoll._heard = unheard  # type: ignore[method-assign]
