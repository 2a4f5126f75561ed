"""``X-Request-Timeout`` can only shorten a deployment's ``request_timeout_s``, never extend it."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from rq.job import Job

from streamserve.client.jobs import JOB_SERIALIZER
from streamserve.runtime.settings import Settings
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy
from tests.integration.test_gateway_app import wait_for_routes

DEPLOYMENT_TIMEOUT_S = 0.5
# Far longer than the deployment's timeout: a request that is allowed to wait for it gets a 200.
HANDLER_SLEEP_S = 2.0
SLEEPY = {
    "name": "sleepy",
    "import_path": "examples.sleepy:Sleepy",
    "route_prefix": "/sleepy",
    "request_timeout_s": DEPLOYMENT_TIMEOUT_S,
}


@pytest.mark.parametrize(
    ("header", "effective_s"),
    [("999", DEPLOYMENT_TIMEOUT_S), ("0.2", 0.2)],
    ids=["longer-is-ignored", "shorter-wins"],
)
async def test_the_deadline_is_the_shorter_of_the_header_and_the_deployments_timeout(
    start_replica: StartReplica,
    http: httpx.AsyncClient,
    aredis: aioredis.Redis,
    settings: Settings,
    header: str,
    effective_s: float,
) -> None:
    await start_replica(**SLEEPY)
    await wait_for_routes(http)
    stream = settings.keys.requests("sleepy")
    sent_ms = time.time() * 1000
    started = time.monotonic()
    call = asyncio.create_task(
        http.post("/sleepy", json={"seconds": HANDLER_SLEEP_S}, headers={"X-Request-Timeout": header})
    )

    async def queued() -> bool:
        return bool(await aredis.xlen(stream))

    await wait_for_async(queued, 10)
    seen_ms = time.time() * 1000
    [(_id, fields)] = cast(list[tuple[bytes, dict[bytes, bytes]]], await aredis.xrange(stream))
    deadline_ms = int(fields[b"deadline_ms"])
    # The deadline the gateway queued is "now" (between sending and seeing it) plus the shorter timeout.
    assert sent_ms + effective_s * 1000 - 1 <= deadline_ms <= seen_ms + effective_s * 1000 + 1

    resp = await call
    elapsed = time.monotonic() - started
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"] == "RequestTimeoutError"
    assert effective_s * 0.9 <= elapsed < HANDLER_SLEEP_S * 0.75  # at the deadline, not when the handler ends


async def test_a_job_asked_for_with_a_longer_header_keeps_the_deployments_timeout(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    await deploy(settings, **SLEEPY)
    await wait_for_routes(http)
    accepted = await http.post(
        "/sleepy", json={"seconds": 1}, headers={"Prefer": "respond-async", "X-Request-Timeout": "999"}
    )
    assert accepted.status_code == 202, accepted.text
    connection = redis.Redis.from_url(settings.effective_redis_url)
    try:
        job = Job.fetch(accepted.json()["job_id"], connection=connection, serializer=JOB_SERIALIZER)
        # (name, body, method, timeout, priority, tenant)
        assert job.args == ["sleepy", {"seconds": 1}, "", DEPLOYMENT_TIMEOUT_S, "normal", "default"]
    finally:
        connection.close()
