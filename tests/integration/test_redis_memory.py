"""A Redis that is out of memory refuses writes; callers get 503 OverloadedError, never a crash or a hang."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import orjson
import pytest
import redis

from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.errors import OverloadedError
from streamserve.wire.ids import ReplicaID
from streamserve.workers.replica import Replica
from tests.harness.paths import STREAMSERVE
from tests.integration.conftest import gateway_http


def test_up_rejects_a_maxmemory_that_is_not_a_size(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("deployments: []\n")
    result = subprocess.run(
        [STREAMSERVE, "up", str(config), "--redis-maxmemory", "lots"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "'lots' is not a size like 512mb or 2gb" in result.stderr


async def test_out_of_memory_is_503_for_http_and_overloaded_for_the_client() -> None:
    with EmbeddedRedis(port=free_port(), maxmemory="64mb") as server:
        admin = redis.Redis.from_url(server.url)
        assert admin.config_get("maxmemory") == {"maxmemory": str(64 * 2**20)}
        assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        settings = Settings(redis_url=server.url, heartbeat_interval_s=0.2)
        cfg = DeploymentConfig.model_validate({"name": "rec", "import_path": "tests.deployments:Recorder"})
        conn = async_redis(server.url)
        await DesiredState(conn, settings.keys).apply(AppConfig(deployments=[cfg]))
        replica = Replica(settings, conn, ReplicaID.new("rec"))
        serving = asyncio.create_task(replica.run())
        try:
            async with AsyncClient(settings=settings) as client, gateway_http(settings) as http:
                assert (await client.call("rec", 1, timeout=10))["body"] == 1
                admin.config_set("maxmemory", 1)  # full: every write that needs memory is refused
                try:
                    with pytest.raises(OverloadedError, match="out of memory"):
                        await client.call("rec", 2, timeout=10)
                    response = await http.post("/rec", json=3)
                    assert response.status_code == 503, response.text
                    assert response.json()["error"] == "OverloadedError" and "Retry-After" in response.headers
                    deploy = await http.post("/-/deploy", content=orjson.dumps({"deployments": [cfg.model_dump()]}))
                    assert deploy.status_code in (200, 503), deploy.text  # unchanged config: nothing to write
                    other = {"deployments": [{"name": "more", "import_path": "tests.deployments:Recorder"}]}
                    refused = await http.post("/-/deploy", content=orjson.dumps(other))
                    assert refused.status_code == 503 and refused.json()["error"] == "OverloadedError"
                finally:
                    admin.config_set("maxmemory", 64 * 2**20)
                assert (await client.call("rec", 4, timeout=10))["body"] == 4  # and it carries on
        finally:
            replica.request_stop()
            await asyncio.wait_for(serving, timeout=10)
            await conn.aclose()
            admin.close()
