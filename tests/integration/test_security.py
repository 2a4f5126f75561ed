"""Nobody who merely reaches the gateway can make the farm run code (issue: safe by default).

- Off loopback, a gateway (or ``up``) with an open admin API refuses to start.
- ``STREAMSERVE_IMPORT_ALLOW`` refuses other modules where configs are written (HTTP, CLI, client) and again
  where replicas import them, judging there every object the import path reaches.
- Job workers run streamserve's job function only (test_job_guard.py).
- ``STREAMSERVE_ADMIN=off`` turns every admin write away.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import httpx
import orjson
import pytest
import redis as sync_redis_module

from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.control.security import ImportAllowList
from streamserve.runtime.processes import free_port, stop_group
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.errors import ConfigError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat
from streamserve.wire.states import ReplicaHealth
from streamserve.workers.replica import Replica
from tests.harness.farm import gateway_process
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for
from tests.integration.conftest import gateway_http

PWN = {"deployments": [{"name": "pwn", "import_path": "os:system"}]}


def env(redis_url: str, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
    return {**clean, "REDIS_URL": redis_url, **extra}


def stored_deployments(redis_url: str) -> set[str]:
    client = sync_redis_module.Redis.from_url(redis_url)
    try:
        return {k.decode() for k in client.hkeys(Settings(redis_url=redis_url).keys.deployments())}
    finally:
        client.close()


async def test_the_allow_list_refuses_other_modules_on_every_write_path(settings: Settings, tmp_path: Path) -> None:
    allowed = settings.model_copy(update={"import_allow": "tests,examples"})
    async with gateway_http(allowed) as http:
        refused = await http.post("/-/deploy", content=orjson.dumps(PWN))
    assert refused.status_code == 400
    assert refused.json()["error"] == "ConfigError"
    assert "'os:system' is outside STREAMSERVE_IMPORT_ALLOW (tests, examples)" in refused.json()["message"]

    async with AsyncClient(settings=allowed) as client:
        with pytest.raises(ConfigError, match="outside STREAMSERVE_IMPORT_ALLOW"):
            await client.deploy(AppConfig.model_validate(PWN))

    config = tmp_path / "pwn.yaml"
    config.write_text("deployments:\n  - name: pwn\n    import_path: builtins:eval\n")
    cli = subprocess.run(
        [STREAMSERVE, "deploy", str(config)],
        env=env(settings.effective_redis_url, STREAMSERVE_IMPORT_ALLOW="examples"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 2 and "outside STREAMSERVE_IMPORT_ALLOW (examples)" in cli.stderr
    assert stored_deployments(settings.effective_redis_url) == set()

    async with gateway_http(allowed) as http:  # what is under a prefix still deploys
        ok = await http.post(
            "/-/deploy", content=orjson.dumps({"deployments": [{"name": "echo", "import_path": "examples.echo:Echo"}]})
        )
    assert ok.status_code == 200, ok.text


async def failed_start(settings: Settings, import_path: str, write_allow: str | None) -> Heartbeat:
    """Write a deployment (checked against ``write_allow`` only), run one replica under the allow-list
    ``examples``: it exits 1, and its last heartbeat (FAILED) is returned."""
    cfg = DeploymentConfig.model_validate({"name": "pwn", "import_path": import_path})
    redis = async_redis(settings.effective_redis_url)
    try:
        await DesiredState(redis, settings.keys, ImportAllowList.parse(write_allow)).apply(AppConfig(deployments=[cfg]))
        replica = Replica(settings.model_copy(update={"import_allow": "examples"}), redis, ReplicaID.new("pwn"))
        assert await asyncio.wait_for(replica.run(), timeout=10) == 1
        raw = await redis.hget(settings.keys.heartbeats("pwn"), replica.replica_id.to_str())
        assert raw is not None
        beat = Heartbeat.decode(raw)
        assert beat.health is ReplicaHealth.FAILED
        return beat
    finally:
        await redis.aclose()


async def test_a_replica_refuses_a_module_outside_the_allow_list(settings: Settings) -> None:
    """A config that reached Redis some other way (an old write, someone with redis-cli) still does not run."""
    beat = await failed_start(settings, "tests.deployments:Recorder", write_allow=None)  # no allow-list at the write
    assert "'tests.deployments:Recorder' is outside STREAMSERVE_IMPORT_ALLOW (examples)" in beat.message


async def test_a_replica_refuses_a_path_that_walks_out_of_an_allowed_module(settings: Settings) -> None:
    """``examples.echo:os.system`` names an allowed module, so the write takes it; the replica resolves it and stops at
    ``os``, before reading ``system``, and its FAILED heartbeat says which object came from where."""
    beat = await failed_start(settings, "examples.echo:os.system", write_allow="examples")
    assert beat.message == (
        "ConfigError: deployment 'pwn': import_path 'examples.echo:os.system' is refused: 'examples.echo:os' is "
        "the module 'os' from module 'os', outside STREAMSERVE_IMPORT_ALLOW (examples); name a function or class "
        "defined in an allowed module"
    )


async def test_admin_off_turns_every_write_away(settings: Settings) -> None:
    off = settings.model_copy(update={"admin": False})
    async with gateway_http(off) as http:
        writes = [
            await http.post("/-/deploy", content=orjson.dumps(PWN)),
            await http.post("/-/deployments/x/scale", json={"num_replicas": 1}),
            await http.delete("/-/deployments/x"),
            await http.post("/-/endpoints/e/traffic", json={"traffic": {"x": 1}}),
            await http.delete("/-/endpoints/e"),
        ]
        reads = await http.get("/-/status")
    for response in writes:
        assert response.status_code == 403, response.text
        assert response.json()["error"] == "ForbiddenError" and "STREAMSERVE_ADMIN=off" in response.json()["message"]
    assert reads.status_code == 200
    assert stored_deployments(settings.effective_redis_url) == set()


def run(args: list[str], redis_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STREAMSERVE, *args], cwd=ROOT, env=env(redis_url, **extra), capture_output=True, text=True, timeout=60
    )


def test_no_open_admin_api_off_loopback(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    gateway = run(["gateway", "--host", "0.0.0.0", "--port", str(port)], redis_url)
    assert gateway.returncode == 2
    assert "refusing to bind 0.0.0.0" in gateway.stderr and "STREAMSERVE_API_KEY" in gateway.stderr
    assert "--no-admin" in gateway.stderr

    for blank in ("", "   "):
        refused = run(["gateway", "--port", str(port)], redis_url, STREAMSERVE_API_KEY=blank)
        assert refused.returncode == 2 and "STREAMSERVE_API_KEY: set but blank" in refused.stderr, refused.stderr
        assert run(["status"], redis_url, STREAMSERVE_API_KEY=blank).returncode == 2


def test_up_serves_off_loopback_its_admin_writes_guarded_by_the_token_it_made(redis_url: str, tmp_path: Path) -> None:
    """Unlike a gateway run alone, `up` always has a token for admin writes (STREAMSERVE_API_KEY, or one it makes):
    it refused --host 0.0.0.0 all the same, asking for STREAMSERVE_API_KEY."""
    port = free_port()
    config = tmp_path / "c.yaml"
    config.write_text("deployments:\n  - name: echo\n    import_path: examples.echo:Echo\n    num_replicas: 0\n")
    data_dir = tmp_path / "farm"
    with (tmp_path / "up.log").open("wb") as log:
        up = subprocess.Popen(
            [STREAMSERVE, "up", str(config), "--host", "0.0.0.0", "--port", str(port), "--data-dir", str(data_dir)],
            cwd=ROOT,
            env=env(redis_url),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def serves() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return up.poll() is not None

        wait_for(serves, 60, lambda: (tmp_path / "up.log").read_text())
        assert up.poll() is None, (tmp_path / "up.log").read_text()
        refused = httpx.post(f"http://127.0.0.1:{port}/-/deploy", json=PWN, timeout=10)
        assert refused.status_code == 401, refused.text
        token = (data_dir / "api_key").read_text().strip()
        scale = {"num_replicas": 0}
        allowed = httpx.post(
            f"http://127.0.0.1:{port}/-/deployments/echo/scale",
            json=scale,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert allowed.status_code == 200, allowed.text
    finally:
        stop_group(up, timeout_s=30)
    assert "pwn" not in stored_deployments(redis_url)


def test_no_admin_serves_off_loopback_with_writes_switched_off(redis_url: str, tmp_path: Path) -> None:
    with gateway_process(redis_url, tmp_path, "--host", "0.0.0.0", "--no-admin") as port:
        write = httpx.post(f"http://127.0.0.1:{port}/-/deploy", content=orjson.dumps(PWN), timeout=10)
    assert write.status_code == 403 and write.json()["error"] == "ForbiddenError"
    assert stored_deployments(redis_url) == set()
