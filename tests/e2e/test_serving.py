"""The serving path end to end: real `streamserve up`, scheduler, gateway and replica processes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streamserve import AsyncClient, Client, RemoteError
from streamserve.runtime.processes import free_port
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

REDIS_CLI = str(Path(sys.executable).with_name("redis-cli"))

pytestmark = pytest.mark.e2e


def test_http_post_answers_with_result_and_headers(farm: Farm) -> None:
    resp = farm.post("/echo", {"x": [1, 2, 3]})
    assert resp.status_code == 200
    assert resp.json() == {"echo": {"x": [1, 2, 3]}, "greeting": "hi"}
    assert resp.headers["x-deployment"] == "echo"
    assert resp.headers["x-replica"].startswith("echo#")
    assert resp.headers["x-request-id"]


def test_python_client_call_submit_send(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        assert client.call("echo", {"x": 1}, timeout=5) == {"echo": {"x": 1}, "greeting": "hi"}
        future = client.submit("add", {"a": 2, "b": 3})
        assert future.result(timeout=10) == {"sum": 5}
        sent = client.send("ledger", {"id": "fire-and-forget"})
        assert isinstance(sent, str) and sent
        wait_for(
            lambda: "fire-and-forget" in client.call("ledger", None, method="seen", timeout=5),
            10,
            "a request sent fire-and-forget never ran",
        )
        with pytest.raises(RemoteError) as info:
            client.call("add", {"a": 1}, timeout=5)
        assert info.value.error_type == "KeyError"

    async def use_async() -> list[object]:
        async with AsyncClient(farm.effective_redis_url) as client:
            return list(await asyncio.gather(*(client.call("add", {"a": i, "b": 1}) for i in range(20))))

    assert asyncio.run(use_async()) == [{"sum": i + 1} for i in range(20)]


def test_user_exception_is_500_with_type_and_message_and_serving_goes_on(farm: Farm) -> None:
    resp = farm.post("/add", {"a": 1})
    assert resp.status_code == 500
    assert resp.json()["error"] == "KeyError"
    assert resp.json()["message"] == "'b'"
    assert "Traceback" not in resp.text
    assert farm.post("/add", {"a": 1, "b": 1}).json() == {"sum": 2}


def test_bad_input_gets_clear_errors(farm: Farm) -> None:
    assert farm.post("/nowhere", {}).status_code == 404
    bad = httpx_post_raw(farm, "/echo", b"{not json")
    assert bad.status_code == 400
    assert "not valid JSON" in bad.json()["message"]


def httpx_post_raw(farm: Farm, path: str, content: bytes):  # type: ignore[no-untyped-def]
    import httpx

    return httpx.post(farm.base_url + path, content=content, timeout=10)


def test_redis_cli_shows_streams_group_replicas_and_deployments(farm: Farm) -> None:
    def cli(*args: str) -> str:
        url = farm.effective_redis_url
        return subprocess.run([REDIS_CLI, "-u", url, *args], capture_output=True, text=True, timeout=10).stdout

    groups = cli("XINFO", "GROUPS", "streamserve:{echo}:requests")
    assert "replicas" in groups
    deployments = cli("HGET", "{streamserve}:deployments", "echo")
    assert orjson.loads(deployments)["import_path"] == "examples.echo:Echo"
    replicas = cli("HGETALL", "streamserve:{echo}:replicas")
    assert '"state":"RUNNING"' in replicas


def test_kill_9_replica_is_replaced(farm: Farm) -> None:
    before = farm.status()["echo"]
    victim = before["replicas"][0]
    os.kill(victim["pid"], signal.SIGKILL)

    def back_at_target() -> bool:
        echo = farm.status()["echo"]
        ids = {r["replica_id"] for r in echo["replicas"]}
        return echo["running"] == 2 and len(ids) == 2 and victim["replica_id"] not in ids

    wait_for(back_at_target, 20, "replica was not replaced")
    assert farm.post("/echo", 1).status_code == 200


def test_scale_and_status_table(farm: Farm) -> None:
    farm.cli("scale", "add", "2")
    wait_for(lambda: farm.status()["add"]["running"] == 2, 20, "did not scale up")
    table = farm.cli("status").stdout
    assert table.splitlines()[0].split()[:3] == ["DEPLOYMENT", "HEALTH", "TARGET"]
    farm.cli("scale", "add", "1")
    wait_for(lambda: len(farm.status()["add"]["replicas"]) == 1, 20, "did not scale down")


def test_deploy_wait_reports_success_and_failure(farm: Farm, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("deployments:\n  - name: adder\n    import_path: examples.functions:add\n    num_replicas: 1\n")
    ok = farm.cli("deploy", str(good), "--wait", "--timeout", "60")
    assert "adder: done, 1 replica(s) running" in ok.stdout
    assert farm.cli("deploy", str(good)).stdout.strip() == "no change"

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "deployments:\n  - name: broken\n    import_path: tests.deployments:FailingConstructor\n    num_replicas: 1\n"
    )
    # A request queued before the scheduler found the deployment broken waits for its deadline in vain; the 504
    # says why.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        farm.cli("deploy", str(bad))
        early = pool.submit(farm.post, "/broken", 1, headers={"X-Request-Timeout": "20"})
        failed = farm.cli("deploy", str(bad), "--wait", "--timeout", "60", check=False)
        waited = early.result(40)
    assert waited.status_code == 504, waited.text
    assert waited.json()["message"].endswith(
        "): deployment 'broken' has no running replica: RuntimeError: weights not found"
    ), waited.json()
    assert failed.returncode == 1
    assert "broken: RuntimeError: weights not found" in failed.stderr
    again = farm.cli("deploy", str(bad), "--wait", "--timeout", "60", check=False)  # unchanged, still broken
    assert again.returncode == 1 and "broken: RuntimeError: weights not found" in again.stderr
    assert "adder: unchanged, 1 replica(s) running" in farm.cli("deploy", str(good), "--wait").stdout
    assert "weights not found" in farm.cli("status").stdout
    # Its replicas' logs say where in the user's code it failed.
    logs = farm.cli("logs", "broken").stdout
    assert "Traceback" in logs and "tests/deployments.py" in logs and "weights not found" in logs, logs
    # No replica and none can start: callers are refused at once instead of waiting for their deadline.
    wait_for(lambda: farm.post("/broken", 1).status_code == 503, 10, "gateway still queues for a broken deployment")
    refused = farm.post("/broken", 1)
    assert refused.json()["error"] == "UnavailableError"
    assert "weights not found" in refused.json()["message"]
    # Scaled to 0, the way to quieten it: nothing left to fail, so the goal is done and the deployment healthy.
    assert farm.cli("scale", "broken", "0", "--wait", "--timeout", "60", check=False).returncode == 0
    assert farm.status()["broken"]["health"] == "HEALTHY"
    farm.cli("delete", "broken")
    # --wait: until its replica has stopped too (the next test on this farm counts the replicas' processes).
    farm.cli("delete", "adder", "--wait", "--timeout", "60")
    wait_for(lambda: not {"broken", "adder"} & set(farm.status()), 20, "deleted deployments still listed")


def test_a_second_up_on_a_running_farms_directory_is_refused(farm: Farm) -> None:
    """Two farms on one data directory would share the embedded Redis's files, and the second one's scheduler would
    kill the first one's replicas as dead: the second `up` is refused, and the first one goes on untouched."""
    replicas = set(farm.role_pids().get("worker", []))
    command = [farm.command, "up", str(farm.config), "--port", str(free_port()), "--data-dir", str(farm.data_dir)]
    second = subprocess.run(
        [*command, "--redis-port", str(free_port())],
        cwd=farm.cwd,
        env=farm.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert "a streamserve up already runs from" in second.stderr and f"gateway {farm.base_url}" in second.stderr
    assert farm.post("/echo", {"still": "here"}).status_code == 200
    assert set(farm.role_pids().get("worker", [])) == replicas
