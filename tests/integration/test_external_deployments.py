"""An externally scaled deployment through the gateway: requests queue at 0 replicas (bounded), and its replica
count is refused as a write, since someone else sets it."""

from __future__ import annotations

import asyncio

import httpx
import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.wire.priorities import Priority
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy
from tests.integration.test_gateway_app import wait_for_routes


async def test_a_request_waits_for_a_worker_instead_of_a_503(http: httpx.AsyncClient, settings: Settings) -> None:
    await deploy(settings, external_scaler_enabled=True, route_prefix="/ext")
    await wait_for_routes(http)
    waited = await http.post("/ext", json="late", headers={"X-Request-Timeout": "0.3"})
    assert waited.status_code == 504 and waited.json()["error"] == "RequestTimeoutError", waited.text


async def test_requests_queue_at_zero_replicas_until_the_queue_is_full(
    http: httpx.AsyncClient, settings: Settings, start_replica: StartReplica, aredis: aioredis.Redis
) -> None:
    await deploy(settings, external_scaler_enabled=True, max_queued_requests=2, route_prefix="/ext")
    await wait_for_routes(http)

    queued = [asyncio.create_task(http.post("/ext", json=i, timeout=30)) for i in range(2)]

    async def both_queued() -> bool:
        return bool(await aredis.xlen(settings.keys.requests("rec")) == 2)

    await wait_for_async(both_queued, 4, "the two requests were not queued")
    # The queue holds max_queued_requests; one more is refused as overloaded, with nothing lost of the rest.
    full = await http.post("/ext", json="one too many")
    assert full.status_code == 503 and full.json()["error"] == "OverloadedError", full.text

    # The first worker to come serves what waited.
    await start_replica(external_scaler_enabled=True, max_queued_requests=2, route_prefix="/ext")
    served = await asyncio.gather(*queued)
    assert [r.status_code for r in served] == [200, 200]
    assert sorted(r.json()["body"] for r in served) == [0, 1]


async def test_every_priority_level_queues_at_zero_replicas_each_within_its_own_bound(
    http: httpx.AsyncClient, settings: Settings, start_replica: StartReplica, aredis: aioredis.Redis
) -> None:
    await deploy(settings, external_scaler_enabled=True, max_queued_requests=1, route_prefix="/ext")
    await wait_for_routes(http)
    levels = ("high", "normal", "low")

    def post(level: str, body: object) -> asyncio.Task[httpx.Response]:
        return asyncio.create_task(http.post("/ext", json=body, headers={"X-Priority": level}, timeout=30))

    queued = [post(level, level) for level in levels]

    async def all_queued() -> bool:
        lengths = [await aredis.xlen(settings.keys.requests("rec", Priority(level))) for level in levels]
        return lengths == [1, 1, 1]

    await wait_for_async(all_queued, 4, "a request per level was not queued")
    # Each level's queue holds max_queued_requests: a full low queue refuses more low, never another level.
    full = await http.post("/ext", json="one too many", headers={"X-Priority": "low"})
    assert full.status_code == 503 and full.json()["error"] == "OverloadedError", full.text
    assert "1 low-priority request queued (max_queued_requests)" in full.json()["message"]

    await start_replica(external_scaler_enabled=True, max_queued_requests=1, route_prefix="/ext")
    served = await asyncio.gather(*queued)
    assert [r.status_code for r in served] == [200, 200, 200]
    assert [r.json()["body"] for r in served] == list(levels)


async def test_scaling_it_is_refused_with_the_reason(http: httpx.AsyncClient, settings: Settings) -> None:
    await deploy(settings, external_scaler_enabled=True)
    refused = await http.post("/-/deployments/rec/scale", json={"num_replicas": 3})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "ConflictError"
    assert "scaled externally (external_scaler_enabled: true)" in refused.json()["message"]
