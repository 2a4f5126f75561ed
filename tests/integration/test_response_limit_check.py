"""Deploys hold max_response_bytes to a tenth of Redis's maxmemory: a limit that would let one reply fill Redis is
refused at deploy, naming both numbers, instead of being found out when such a reply comes back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from streamserve.control.desired_state import DesiredState
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig
from streamserve.wire.keys import Keys
from tests.integration.conftest import gateway_http

MAXMEMORY = 64 * 2**20
TENTH = MAXMEMORY // 10


@pytest.fixture
def small_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(port=free_port(), maxmemory="64mb") as server:
        yield server


def config(name: str = "big", **fields: Any) -> dict[str, Any]:
    return {"deployments": [{"name": name, "import_path": "tests.deployments:Recorder", **fields}]}


async def test_a_max_response_bytes_above_a_tenth_of_maxmemory_is_refused_at_deploy(
    small_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway_http(Settings(redis_url=small_redis.url)) as http:
        refused = await http.post("/-/deploy", json=config(max_response_bytes=10_000_000))
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "ConfigError"
        message = refused.json()["message"]
        assert "deployment 'big': max_response_bytes (10000000 bytes)" in message, message
        assert f"more than 1/10 of Redis's maxmemory ({MAXMEMORY} bytes)" in message, message
        assert f"set max_response_bytes to {TENTH} or less, or give Redis more memory" in message, message
        assert (await http.get("/-/status")).json()["deployments"] == []  # nothing was written

        assert (await http.post("/-/deploy", json=config(max_response_bytes=TENTH))).status_code == 200
        raised = await http.post("/-/deploy", json=config(max_response_bytes=TENTH + 1))
        assert raised.status_code == 400 and f"({TENTH + 1} bytes)" in raised.json()["message"], raised.text
        assert (await http.post("/-/deployments/big/scale", json={"num_replicas": 2})).status_code == 200

        # The default (16 MiB) is above a tenth of 64 MB too: a config that never chose it still deploys, with a
        # warning, as it did before the check.
        with caplog.at_level(logging.WARNING, logger="streamserve.control.desired_state"):
            plain = await http.post("/-/deploy", json=config("plain"))
        assert plain.status_code == 200, plain.text
        assert "deployment 'plain': max_response_bytes (16777216 bytes)" in caplog.text
        assert "max_response_bytes is at its default" in caplog.text


async def test_the_check_is_skipped_where_redis_will_not_tell_its_maxmemory(small_redis: EmbeddedRedis) -> None:
    admin = redis.Redis.from_url(small_redis.url)
    admin.acl_setuser(
        "deployer", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-info"]
    )
    admin.close()
    conn = async_redis(small_redis.url.replace("redis://", "redis://deployer:pw@"))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            await conn.info("memory")
        applied = await DesiredState(conn, Keys()).apply(AppConfig.model_validate(config(max_response_bytes=10**7)))
        assert list(applied.goals) == ["big"]
    finally:
        await conn.aclose()
