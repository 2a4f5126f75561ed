"""STREAMSERVE_KEY_PREFIX: with a custom prefix everything serves, and every key written starts with it.

The prefix comes from the environment, as a user sets it: the settings, the command line, a replica,
the client, the gateway app and a scheduler tick all run with it against the real redis-server, and
then every key and pub/sub channel in Redis is checked. RQ's own keys start with ``rq:`` (docs/tutorial.md:
"RQ owns its keys, under its own fixed rq: prefix"), and name the queue ``<prefix>:jobs``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.scheduler.scheduler import Scheduler
from tests.harness.fake_launcher import FakeLauncher
from tests.harness.paths import ROOT, STREAMSERVE
from tests.integration.conftest import StartReplica
from tests.integration.test_gateway_app import wait_for_routes

PREFIX = "acme-serve"


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The integration fixtures' settings, with the prefix set the user's way: in the environment."""
    monkeypatch.setenv("STREAMSERVE_KEY_PREFIX", PREFIX)
    return Settings(redis_url=redis_url, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0, tick_interval_s=0.1)


async def streamserve(*args: str) -> str:
    """The ``streamserve`` console script, with this process's environment (so the prefix); it must exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    cmd = [STREAMSERVE, *args]
    result = await asyncio.to_thread(
        subprocess.run, cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"streamserve {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


async def test_a_custom_key_prefix_serves_and_every_key_starts_with_it(
    settings: Settings,
    redis_url: str,
    aredis: aioredis.Redis,
    start_replica: StartReplica,
    client: AsyncClient,
    http: httpx.AsyncClient,
) -> None:
    assert settings.key_prefix == PREFIX  # read from STREAMSERVE_KEY_PREFIX

    replica = await start_replica(route_prefix="/rec")
    assert await client.call("rec", {"x": 1}, timeout=10) == {"tag": "rec", "body": {"x": 1}, "config": None}
    await wait_for_routes(http)
    resp = await http.post("/rec", json={"x": 2})
    assert resp.status_code == 200 and resp.headers["x-replica"] == replica.replica_id.to_str()
    job_id = await client.submit_job("rec", {"x": 3})  # queued for a job worker (none runs here)

    # The command line (a process of its own) reads the prefix from the environment too: it finds the
    # deployment and writes the endpoint.
    await streamserve("traffic", "--redis-url", redis_url, "rec_split", "rec=1")
    report: dict[str, Any] = orjson.loads(await streamserve("status", "--json", "--redis-url", redis_url))
    assert [d["name"] for d in report["deployments"]] == ["rec"]
    assert [e["name"] for e in report["endpoints"]] == ["rec_split"]
    assert await client.call("rec_split", "via the endpoint", timeout=10) == {
        "tag": "rec",
        "body": "via the endpoint",
        "config": None,
    }

    # A scheduler tick writes its verdicts and its replica records.
    await Scheduler(settings, aredis, FakeLauncher()).tick()

    channels = sorted(text(c) for c in await aredis.pubsub_channels())
    assert channels and all(c.startswith(f"{{{PREFIX}}}:") for c in channels), channels

    keys = sorted(text(k) for k in await aredis.keys("*"))
    assert [k for k in keys if not k.startswith((f"{PREFIX}:", f"{{{PREFIX}}}:", "rq:"))] == []
    assert [k for k in keys if k.startswith(("streamserve:", "{streamserve}"))] == []
    expected = {
        f"{{{PREFIX}}}:deployments",
        f"{{{PREFIX}}}:endpoints",
        f"{{{PREFIX}}}:snapshot_ids",
        f"{{{PREFIX}}}:goals",
        f"{{{PREFIX}}}:deployment_status",
        f"{PREFIX}:{{rec}}:requests",
        f"{PREFIX}:{{rec}}:heartbeats",
        f"{PREFIX}:{{rec}}:replicas",
        f"rq:queue:{PREFIX}:jobs",
        f"rq:job:{job_id}",
    }
    assert expected <= set(keys), sorted(expected - set(keys))
    assert any(k.startswith(f"{PREFIX}:replies:") for k in keys)
