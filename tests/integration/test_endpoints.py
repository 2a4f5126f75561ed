"""Endpoints over a real redis-server: writes stay consistent, callers split and mirror traffic and follow changes."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, EndpointConfig
from streamserve.wire.errors import ConfigError, ConflictError, NotFoundError
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy


async def test_writes_keep_endpoints_consistent(client: AsyncClient, settings: Settings) -> None:
    await deploy(settings, name="v1", route_prefix=None)
    desired = DesiredState(client.redis, settings.keys)
    with pytest.raises(ConfigError, match="sends to 'v9', which is not a deployment"):
        await desired.set_traffic("classify", {"v1": 1, "v9": 1})
    created = await desired.set_traffic("classify", {"v1": 1})
    assert created.route_prefix == "/classify"
    with pytest.raises(ConflictError, match="endpoint 'classify' still sends traffic to it"):
        await desired.delete("v1")
    with pytest.raises(ConfigError, match="route_prefix /classify is used by deployment 'other' and endpoint"):
        await deploy(settings, name="other", route_prefix="/classify")
    with pytest.raises(ConfigError, match="'classify' names both a deployment and an endpoint"):
        await deploy(settings, name="classify", route_prefix=None)
    assert not await desired.apply(AppConfig(endpoints=[created]))  # the same again: no change
    # What the client knows follows (a gateway counts figures only for those: metrics/flusher.py).
    await wait_for_async(lambda: client.knows("classify") and client.knows("v1"), 10, "the routes were not pushed")
    assert not client.knows("v9")
    await desired.delete_endpoint("classify")
    with pytest.raises(NotFoundError):
        await desired.delete_endpoint("classify")
    assert await desired.delete("v1")  # nothing routes to it any more
    await wait_for_async(lambda: not client.knows("classify") and not client.knows("v1"), 10, "still known")


async def test_client_splits_mirrors_and_follows_traffic_changes(
    start_replica: StartReplica, client: AsyncClient, settings: Settings
) -> None:
    for tag in ("v1", "v2", "v3"):
        await start_replica(name=tag, init_kwargs={"tag": tag}, route_prefix=None)
    deployments.CALLS_BY_TAG.clear()
    await client.set_traffic("classify", {"v1": 3, "v2": 1}, shadow={"v3": 0.5})

    replies = await asyncio.gather(*(client.call("classify", i) for i in range(400)))
    served = Counter(r["tag"] for r in replies)
    assert set(served) == {"v1", "v2"}  # a shadow's reply never reaches the caller
    assert 0.65 < served["v1"] / 400 < 0.85
    mirrored = deployments.CALLS_BY_TAG
    await wait_for_async(lambda: mirrored["v3"] >= 140, 10)

    async def shadow_queue_drained() -> bool:
        return await client.redis.xlen(settings.keys.requests("v3")) == 0

    await wait_for_async(shadow_queue_drained, 10)
    assert 140 <= mirrored["v3"] <= 260

    await client.set_traffic("classify", {"v2": 1}, shadow={})
    before = mirrored["v3"]

    async def all_to_v2() -> bool:
        return {r["tag"] for r in await asyncio.gather(*(client.call("classify", i) for i in range(20)))} == {"v2"}

    await wait_for_async(all_to_v2, 10)
    assert await client.call("v1", "direct")  # its deployments stay callable by name
    assert mirrored["v3"] - before < 20  # at most what was drawn before the change arrived


async def test_gateway_routes_endpoints_and_admin_changes_traffic(
    start_replica: StartReplica,
    http: httpx.AsyncClient,
) -> None:
    await start_replica(name="v1", init_kwargs={"tag": "v1"}, route_prefix=None)
    await start_replica(name="v2", init_kwargs={"tag": "v2"}, route_prefix=None)
    made = await http.post("/-/endpoints/classify/traffic", json={"traffic": {"v1": 1}})
    assert made.status_code == 200 and made.json()["route_prefix"] == "/classify"

    async def deployment_of_a_post() -> str:
        resp = await http.post("/classify", json={"x": 1})
        assert resp.status_code == 200
        assert resp.json()["tag"] == resp.headers["x-deployment"]
        return resp.headers["x-deployment"]

    async def routed() -> bool:
        return bool((await http.get("/-/routes")).json().get("/classify") == "classify")

    async def served_by_v2() -> bool:
        return await deployment_of_a_post() == "v2"

    await wait_for_async(routed, 10)
    assert await deployment_of_a_post() == "v1"
    await http.post("/-/endpoints/classify/traffic", json={"traffic": {"v2": 1}})
    await wait_for_async(served_by_v2, 10)

    refused = await http.delete("/-/deployments/v2")
    assert refused.status_code == 409 and "endpoint 'classify' still sends traffic" in refused.json()["message"]
    bad = await http.post("/-/endpoints/classify/traffic", json={"traffic": {"v2": -1}})
    assert bad.status_code == 400 and "traffic" in bad.json()["message"]
    assert (await http.post("/-/endpoints/classify/traffic", json={"weights": {}})).status_code == 400
    status = (await http.get("/-/status")).json()
    assert [EndpointConfig.model_validate(e).traffic for e in status["endpoints"]] == [{"v2": 1.0}]
    assert (await http.delete("/-/endpoints/classify")).json() == {"deleted": "classify"}
    assert (await http.delete("/-/endpoints/classify")).status_code == 404
