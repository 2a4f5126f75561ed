"""User health checks: a replica whose check_health() raises or hangs is replaced, and status says why; a hanging
check never holds requests up; a healthy one keeps its replica; an externally scaled worker exits 1 instead."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.farm import Farm, Processes, running_farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

KINDS = {  # deployment -> (mode, run_async)
    "sync-raise": ("raise", False),
    "sync-hang": ("hang", False),
    "async-hang": ("hang", True),
    "healthy": ("raise", False),  # its marker is never made
}


def config(markers: Path) -> str:
    text = "deployments:\n"
    for name, (mode, run_async) in KINDS.items():
        text += (
            f"  - name: {name}\n    import_path: tests.deployments:Checked\n"
            f"    init_kwargs: {{marker: '{markers / name}', mode: {mode}, run_async: {str(run_async).lower()}}}\n"
            "    num_replicas: 1\n    health_check_period_s: 0.2\n    health_check_timeout_s: 2\n"
            "    graceful_shutdown_timeout_s: 2\n"
        )
    return text


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Farm, Path]]:
    workdir = tmp_path_factory.mktemp("health")
    markers = workdir / "markers"
    markers.mkdir()
    path = workdir / "config.yaml"
    path.write_text(config(markers))
    with running_farm(path, workdir) as farm:
        yield farm, markers


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def running(farm: Farm, name: str) -> list[dict[str, Any]]:
    return [r for r in farm.status()[name]["replicas"] if r["state"] == "RUNNING"]


def replaced(farm: Farm, name: str, old: dict[str, Any]) -> bool:
    now = running(farm, name)
    return len(now) == 1 and now[0]["replica_id"] != old["replica_id"]


@pytest.mark.parametrize("name", ["sync-raise", "async-hang"])
def test_a_failing_check_gets_its_replica_replaced_and_status_says_why(farm: tuple[Farm, Path], name: str) -> None:
    farm_, markers = farm
    [old] = running(farm_, name)
    (markers / name).touch()
    wait_for(lambda: replaced(farm_, name, old), 30, f"{name}: the unhealthy replica was not replaced")
    (markers / name).unlink(missing_ok=True)  # the next replica is healthy (a slow machine may see it replaced too)
    status = farm_.status()[name]
    named = re.search(rf"replaced unhealthy replica ({re.escape(name)}#\w+)", status["message"])
    assert named is not None, status["message"]
    # The replica named is the one replaced (or, should the next one have been too, that one): never one running.
    assert named[1] == old["replica_id"] or named[1] not in {r["replica_id"] for r in running(farm_, name)}
    message = status["message"]
    if name == "sync-raise":
        assert "check_health() raised RuntimeError: the database is gone" in message, message
        table = farm_.cli("status").stdout
        assert f"{name}: replaced unhealthy replica {named[1]}: check_health() raised" in table, table
    else:
        assert "check_health() did not answer within 2s" in message, message
    wait_for(lambda: not alive(old["pid"]), 15, "the unhealthy replica's process did not exit")
    assert farm_.post(f"/{name}", {"x": 1}).json() == {"x": 1}


def test_a_hanging_check_never_holds_requests_up(farm: tuple[Farm, Path]) -> None:
    farm_, markers = farm
    [old] = running(farm_, "sync-hang")
    (markers / "sync-hang").touch()
    calls = Path(f"{markers / 'sync-hang'}.calls")
    hanging_since = calls.stat().st_size
    wait_for(lambda: calls.stat().st_size > hanging_since, 10, "the check was not called")
    answered = 0
    with httpx.Client(base_url=farm_.base_url, timeout=1.0) as http:  # the check hangs for 2 s meanwhile
        # Asked at once (a look at the farm's status first, a CLI run, took the whole hang on a busy host), then for
        # as long as the replica with the hung check is the one that runs.
        while True:
            assert http.post("/sync-hang", json=answered).json() == answered  # within 1 s: not held up
            answered += 1
            if answered >= 200 or [r["replica_id"] for r in running(farm_, "sync-hang")] != [old["replica_id"]]:
                break
    (markers / "sync-hang").unlink()  # the replacement is healthy
    wait_for(lambda: replaced(farm_, "sync-hang", old), 30, "the hanging replica was not replaced")
    assert "check_health() did not answer within 2s" in farm_.status()["sync-hang"]["message"]
    # The hung check thread does not keep the old process alive.
    wait_for(lambda: not alive(old["pid"]), 15, "the replica with a hung check did not exit")


def test_a_healthy_check_keeps_its_replica(farm: tuple[Farm, Path]) -> None:
    farm_, markers = farm
    [replica] = running(farm_, "healthy")
    calls = Path(f"{markers / 'healthy'}.calls")
    seen = calls.stat().st_size
    wait_for(lambda: calls.stat().st_size >= seen + 5, 10, "check_health() is not called every 0.2 s")
    assert [r["replica_id"] for r in running(farm_, "healthy")] == [replica["replica_id"]]
    assert farm_.status()["healthy"]["health"] == "HEALTHY"


def test_an_externally_scaled_worker_exits_1_when_its_check_fails(processes: Processes, tmp_path: Path) -> None:
    marker = tmp_path / "ext-marker"
    cfg = tmp_path / "ext.yaml"
    cfg.write_text(
        "deployments:\n  - name: ext\n    import_path: tests.deployments:Checked\n"
        f"    init_kwargs: {{marker: '{marker}'}}\n    external_scaler_enabled: true\n"
        "    health_check_period_s: 0.2\n    graceful_shutdown_timeout_s: 1\n"
    )
    processes.run("deploy", str(cfg))
    worker = processes.spawn("worker", "worker", "ext")
    wait_for(lambda: Path(f"{marker}.calls").exists(), 30, "the worker never checked its health")
    marker.touch()
    assert worker.wait(30) == 1
    assert "unhealthy (check_health() raised RuntimeError: the database is gone)" in processes.log("worker").read_text()
    assert os.path.exists(f"{marker}.calls")
