"""Replicas run in-process (as asyncio tasks) against the real test redis-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from streamserve.app.gateway import create_app
from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.ids import ReplicaID
from streamserve.workers.replica import Replica
from tests import deployments
from tests.harness.waiting import wait_for_async

StartReplica = Callable[..., Awaitable[Replica]]


async def deploy(settings: Settings, **fields: Any) -> DeploymentConfig:
    cfg = DeploymentConfig.model_validate({"name": "rec", "import_path": "tests.deployments:Recorder", **fields})
    redis = async_redis(settings.effective_redis_url)
    try:
        await DesiredState(redis, settings.keys).apply(AppConfig(deployments=[cfg]))
    finally:
        await redis.aclose()
    return cfg


@pytest.fixture
async def start_replica(settings: Settings) -> AsyncIterator[StartReplica]:
    """create(**deployment_fields) deploys the config and runs one replica until the test ends.

    It returns once the replica is ready (within ``ready_timeout_s``, 10 s by default) or has exited.
    """
    running: list[tuple[Replica, asyncio.Task[int], aioredis.Redis]] = []

    async def create(*, ready_timeout_s: float = 10.0, **fields: Any) -> Replica:
        cfg = await deploy(settings, **fields)
        redis = async_redis(settings.effective_redis_url)
        replica = Replica(settings, redis, ReplicaID.new(cfg.name))
        task = asyncio.create_task(replica.run())
        running.append((replica, task, redis))
        beats = settings.keys.heartbeats(cfg.name)

        async def ready_or_exited() -> bool:
            raw = await redis.hget(beats, replica.replica_id.to_str())
            return (raw is not None and b'"ready"' in raw) or task.done()

        await wait_for_async(ready_or_exited, ready_timeout_s, "replica did not become ready", interval_s=0.05)
        return replica

    yield create
    for replica, task, redis in running:
        replica.request_stop()
        await asyncio.wait_for(task, timeout=10)
        await redis.aclose()


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(settings=settings) as c:
        yield c


# The admin token of ``gateway_http``'s gateway when the test's settings have none (admin writes always need one).
TEST_API_KEY = "integration-test-token"


@contextlib.asynccontextmanager
async def gateway_http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app in-process with its client started, behind an ASGI httpx client.

    Without an API key in ``settings``, the gateway gets TEST_API_KEY and the client sends it; a test that sets
    its own key sends it itself (or not)."""
    headers = {}
    if settings.api_key is None:
        settings = settings.model_copy(update={"api_key": SecretStr(TEST_API_KEY)})
        headers["Authorization"] = f"Bearer {TEST_API_KEY}"
    headers["Content-Type"] = "application/json"  # what admin writes take; deployment routes ignore it
    app = create_app(settings)
    await app.gateway.client.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=headers) as http:
            yield http
    finally:
        await app.gateway.client.aclose()


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway_http(settings) as client:
        yield client


@pytest.fixture
async def gate(start_replica: StartReplica) -> AsyncIterator[None]:
    """Gated deployments' handlers hold until the test opens the gate, or ends (before the replica stops)."""
    deployments.GATE = asyncio.Event()
    try:
        yield
    finally:
        deployments.GATE.set()
