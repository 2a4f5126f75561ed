"""The gateway's access log: one line per request, on by default, off with STREAMSERVE_ACCESS_LOG=0."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from tests.harness.farm import gateway_process
from tests.harness.paths import STREAMSERVE
from tests.harness.waiting import wait_for
from tests.integration.conftest import StartReplica


def access_lines(log_dir: Path) -> list[str]:
    return [
        line
        for p in log_dir.glob("gateway-*.log")
        for line in p.read_text().splitlines()
        if "streamserve.access" in line
    ]


async def test_every_request_gets_one_access_line(start_replica: StartReplica, redis_url: str, tmp_path: Path) -> None:
    replica = await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.post("/rec", json=1, headers={"X-Request-ID": "req-ok-1"})).status_code == 200
            assert (await http.post("/rec", content=b"{", headers={"X-Request-ID": "req-bad-2"})).status_code == 400
            assert (await http.get("/-/status", headers={"X-Request-ID": "req-get-3"})).status_code == 200
            assert (await http.post("/nowhere", json=1, headers={"X-Request-ID": "req-404-4"})).status_code == 404
        wait_for(lambda: len(access_lines(tmp_path)) >= 5, 5, lambda: str(access_lines(tmp_path)))
    lines = [line for line in access_lines(tmp_path) if "request_id=req-" in line]  # not the fixture's probes
    assert len(lines) == 4, lines
    ok, bad, get, missing = (
        next(line for line in lines if f"request_id=req-{tag}" in line) for tag in ("ok-1", "bad-2", "get-3", "404-4")
    )
    assert " POST /rec 200 " in ok and "deployment=rec" in ok and f"replica={replica.replica_id}" in ok
    ms = float(ok.split(" POST /rec 200 ")[1].split("ms")[0])
    assert 0 < ms < 5000
    assert " POST /rec 400 " in bad and "deployment=rec" in bad and "replica=-" in bad
    assert " GET /-/status 200 " in get
    assert " POST /nowhere 404 " in missing and "deployment=-" in missing
    assert all(" INFO " in line for line in lines)


async def test_the_access_log_can_be_switched_off(start_replica: StartReplica, redis_url: str, tmp_path: Path) -> None:
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path, STREAMSERVE_ACCESS_LOG="0") as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(3):
                assert (await http.post("/rec", json=1)).status_code == 200
    assert access_lines(tmp_path) == []


async def test_json_access_lines_carry_the_request_id_as_a_field(
    start_replica: StartReplica, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path, STREAMSERVE_LOG_FORMAT="json") as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.post("/rec", json=1, headers={"X-Request-ID": "req-json-1"})).status_code == 200
        wait_for(lambda: any("/rec" in line for line in access_lines(tmp_path)), 5, "no access line for /rec")
    records = [r for r in map(json.loads, access_lines(tmp_path)) if r["path"] == "/rec"]
    assert len(records) == 1
    record = records[0]
    assert record["request_id"] == "req-json-1"
    assert (record["method"], record["path"], record["status"], record["deployment"]) == ("POST", "/rec", 200, "rec")
    assert record["replica"].startswith("rec#") and record["duration_ms"] > 0


def test_an_unknown_log_format_is_an_error_at_start(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "STREAMSERVE_LOG_FORMAT": "xml"}
    for role in (["gateway", "--port", "1"], ["scheduler"], ["worker", "rec"]):
        done = subprocess.run([STREAMSERVE, *role], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, (role, done.stderr)
        assert "STREAMSERVE_LOG_FORMAT" in done.stderr and "'text' or 'json'" in done.stderr
