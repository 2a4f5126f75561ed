"""Replicas run in-process (as asyncio tasks) against the real test redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from streamserve.app.gateway import create_app
from streamserve.workers.replica import Replica

from streamserve.client.clients import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.runtime.processes import free_port, wait_until
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.ids import ReplicaID
from tests import deployments
from tests.e2e.farm import ROOT

STREAMSERVE = str(Path(sys.executable).with_name("streamserve"))

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
        for _ in range(round(ready_timeout_s / 0.05)):
            raw = await redis.hget(beats, replica.replica_id.to_str())
            if raw is not None and b'"ready"' in raw:
                return replica
            if task.done():
                return replica
            await asyncio.sleep(0.05)
        raise AssertionError("replica did not become ready")

    yield create
    for replica, task, redis in running:
        replica.request_stop()
        await asyncio.wait_for(task, timeout=10)
        await redis.aclose()


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(settings=settings) as c:
        yield c


@contextlib.asynccontextmanager
async def gateway_http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app in-process with its client started, behind an ASGI httpx client."""
    app = create_app(settings)
    await app.gateway.client.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            yield http
    finally:
        await app.gateway.client.aclose()


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway_http(settings) as client:
        yield client


@contextlib.contextmanager
def gateway_process(redis_url: str, log_dir: Path, *args: str, **env: str) -> Iterator[int]:
    """A real ``streamserve gateway`` process (uvicorn owns the connections) on a free port, up and healthy;
    ``args`` are extra command-line flags, ``env`` extra STREAMSERVE_* settings. Stopped by pid at the end."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
    environ.update(REDIS_URL=redis_url, **env)
    log_path = log_dir / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [STREAMSERVE, "gateway", "--port", str(port), *args],
            cwd=ROOT,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        assert wait_until(healthy, 30) and proc.poll() is None, log_path.read_text()
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
async def gate(start_replica: StartReplica) -> AsyncIterator[None]:
    """Gated deployments' handlers hold until the test opens the gate, or ends (before the replica stops)."""
    deployments.GATE = asyncio.Event()
    try:
        yield
    finally:
        deployments.GATE.set()
