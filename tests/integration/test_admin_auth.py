"""The admin API's writes with STREAMSERVE_API_KEY set: refused without the right key, and then nothing is written."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import httpx
import orjson
import pytest
import redis
import redis.asyncio as aioredis
from fastapi.routing import APIRoute
from pydantic import SecretStr

from streamserve.app.admin import admin_router
from streamserve.client import AsyncClient
from streamserve.client.jobs import JOB_FUNCTION, JobQueue
from streamserve.runtime.settings import Settings
from tests.integration.conftest import gateway_http

API_KEY = "s3cret"
GUARDED = {"api_key": SecretStr(API_KEY)}
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Every key in Redis and its DUMP: two equal snapshots mean nothing was written in between.
Snapshot = dict[bytes, bytes]
# The id of the job the routes' fixture queues (DELETE /-/jobs/{job_id} cancels it).
SEEDED_JOB = "seeded-job"


@dataclass(frozen=True)
class WriteRoute:
    method: str
    # The path as admin.py declares it.
    template: str
    path: str
    body: Any
    # Checks that the accepted write changed what it should.
    written: Callable[[Settings, aioredis.Redis], Awaitable[None]]

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


async def _deployment(settings: Settings, r: aioredis.Redis, name: str) -> dict[str, Any] | None:
    raw = await r.hget(settings.keys.deployments(), name)
    return None if raw is None else dict(orjson.loads(raw))


async def _endpoint(settings: Settings, r: aioredis.Redis, name: str) -> dict[str, Any] | None:
    raw = await r.hget(settings.keys.endpoints(), name)
    return None if raw is None else dict(orjson.loads(raw))


async def _deployed(settings: Settings, r: aioredis.Redis) -> None:
    fresh = await _deployment(settings, r, "fresh")
    assert fresh is not None and fresh["import_path"] == "examples.functions:noop"


async def _scaled(settings: Settings, r: aioredis.Redis) -> None:
    alpha = await _deployment(settings, r, "alpha")
    assert alpha is not None and alpha["num_replicas"] == 3


async def _deployment_deleted(settings: Settings, r: aioredis.Redis) -> None:
    assert await _deployment(settings, r, "beta") is None


async def _traffic_set(settings: Settings, r: aioredis.Redis) -> None:
    ep = await _endpoint(settings, r, "ep")
    assert ep is not None and ep["traffic"] == {"alpha": 1.0, "beta": 1.0}


async def _job_cancelled(settings: Settings, r: aioredis.Redis) -> None:
    assert await r.exists(settings.keys.job_cancel(SEEDED_JOB))


async def _endpoint_deleted(settings: Settings, r: aioredis.Redis) -> None:
    assert await _endpoint(settings, r, "ep") is None


# Every write of the admin API (admin.py), with a request that succeeds given the key.
WRITE_ROUTES = [
    WriteRoute(
        "POST",
        "/-/deploy",
        "/-/deploy",
        {"deployments": [{"name": "fresh", "import_path": "examples.functions:noop"}]},
        _deployed,
    ),
    WriteRoute("POST", "/-/deployments/{name}/scale", "/-/deployments/alpha/scale", {"num_replicas": 3}, _scaled),
    WriteRoute("DELETE", "/-/deployments/{name}", "/-/deployments/beta", None, _deployment_deleted),
    WriteRoute(
        "POST",
        "/-/endpoints/{name}/traffic",
        "/-/endpoints/ep/traffic",
        {"traffic": {"alpha": 1, "beta": 1}},
        _traffic_set,
    ),
    WriteRoute("DELETE", "/-/endpoints/{name}", "/-/endpoints/ep", None, _endpoint_deleted),
    WriteRoute("DELETE", "/-/jobs/{job_id}", f"/-/jobs/{SEEDED_JOB}", None, _job_cancelled),
]

BAD_CREDENTIALS = {
    "no key": {},
    "wrong X-API-Key": {"X-API-Key": "not-the-key"},
    "wrong bearer": {"Authorization": "Bearer not-the-key"},
    "key as a prefix": {"X-API-Key": API_KEY + "x"},
    "the key under another scheme": {"Authorization": f"Basic {API_KEY}"},
}


# Two deployments (client-only) and an endpoint over the first, and a queued job: something for every write to change.
SEED = {
    "deployments": [
        {"name": "alpha", "import_path": "examples.functions:noop", "num_replicas": 1, "route_prefix": None},
        {"name": "beta", "import_path": "examples.functions:noop", "num_replicas": 1, "route_prefix": None},
    ],
    "endpoints": [{"name": "ep", "traffic": {"alpha": 1}}],
}


@pytest.fixture
async def guarded_http(settings: Settings, connection: redis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway_http(settings.model_copy(update=GUARDED)) as client:
        seeded = await client.post("/-/deploy", json=SEED, headers={"X-API-Key": API_KEY})
        assert seeded.status_code == 200, seeded.text
        queue = JobQueue(connection, settings.keys, settings.job_result_ttl_s).queue
        queue.enqueue_call(JOB_FUNCTION, args=("alpha", None, "", None), job_id=SEEDED_JOB)  # no job worker: it waits
        yield client


async def snapshot(r: aioredis.Redis) -> Snapshot:
    keys = sorted(cast(list[bytes], await r.keys("*")))
    dumps = [await r.dump(key) for key in keys]
    return {key: dump for key, dump in zip(keys, dumps, strict=True) if dump is not None}


async def send(http: httpx.AsyncClient, route: WriteRoute, headers: dict[str, str]) -> httpx.Response:
    content = None if route.body is None else orjson.dumps(route.body)
    return await http.request(route.method, route.path, content=content, headers=headers)


def test_every_admin_write_route_is_covered(settings: Settings, client: AsyncClient) -> None:
    router = admin_router(settings.model_copy(update=GUARDED), client)
    declared = {
        (method, route.path)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in (route.methods or set()) & WRITE_METHODS
    }
    assert declared == {(route.method, route.template) for route in WRITE_ROUTES}


@pytest.mark.parametrize("credentials", BAD_CREDENTIALS.values(), ids=BAD_CREDENTIALS.keys())
@pytest.mark.parametrize("route", WRITE_ROUTES, ids=str)
async def test_a_write_without_the_right_key_is_refused_and_writes_nothing(
    route: WriteRoute, credentials: dict[str, str], guarded_http: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    before = await snapshot(aredis)
    refused = await send(guarded_http, route, credentials)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"] == "UnauthorizedError"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert await snapshot(aredis) == before


@pytest.mark.parametrize("route", WRITE_ROUTES, ids=str)
async def test_a_write_with_its_token_given_twice_is_400_and_writes_nothing(
    route: WriteRoute, guarded_http: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """Which of two tokens counts would be a guess (a wrong X-API-Key beside the right bearer was a 401)."""
    before = await snapshot(aredis)
    refused = await send(guarded_http, route, {"X-API-Key": "nope", "Authorization": f"Bearer {API_KEY}"})
    assert refused.status_code == 400, refused.text
    once = "an admin write takes its token once: in Authorization or in X-API-Key, not both"
    assert refused.json()["message"] == once
    assert await snapshot(aredis) == before


@pytest.mark.parametrize(
    "credentials", [{"X-API-Key": API_KEY}, {"Authorization": f"Bearer {API_KEY}"}], ids=["X-API-Key", "bearer"]
)
@pytest.mark.parametrize("route", WRITE_ROUTES, ids=str)
async def test_a_write_with_the_right_key_is_done(
    route: WriteRoute,
    credentials: dict[str, str],
    guarded_http: httpx.AsyncClient,
    aredis: aioredis.Redis,
    settings: Settings,
) -> None:
    accepted = await send(guarded_http, route, credentials)
    assert accepted.status_code == 200, accepted.text
    await route.written(settings, aredis)
