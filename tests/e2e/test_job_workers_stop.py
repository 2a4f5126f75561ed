"""Jobs across the end of their job worker: Ctrl-C lets a running job finish within the drain time of the
deployment it calls; a job whose worker is killed fails at once, with an error that says so."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_jobs import job_worker_pids
from tests.harness.farm import Farm, farm_on
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - name: nap
    import_path: tests.deployments:crash_on
    num_replicas: 1
    max_ongoing_requests: 2
    graceful_shutdown_timeout_s: 30
    route_prefix: /nap
"""
JOB_S = 12  # longer than the 10 s job workers were given before


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    farm = farm_on(CONFIG, tmp_path).start()
    try:
        yield farm
    finally:
        farm.stop()


def job(farm: Farm, location: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(farm.base_url + location, timeout=10).json()
    return body


def submit(farm: Farm, body: Any) -> str:
    resp = farm.post("/nap", body, headers={"Prefer": "respond-async"})
    assert resp.status_code == 202, resp.text
    location: str = resp.headers["location"]
    wait_for(lambda: job(farm, location)["status"] == "started", 20, "the job never started")
    return location


def test_a_job_whose_worker_is_killed_fails_at_once_saying_so(farm: Farm) -> None:
    location = submit(farm, {"sleep": JOB_S})  # longer than the wait below; the farm's stop drains it (no longer)
    for pid in job_worker_pids(farm):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job(farm, location)["status"] == "failed", 10, f"still {job(farm, location)}")
    error = job(farm, location)["error"]
    assert error["error"] == "JobAbandoned"
    assert "stopped while running it" in error["message"] and "may run yet" in error["message"], error


def test_ctrl_c_lets_a_running_job_finish_within_its_deployments_drain(farm: Farm) -> None:
    location = submit(farm, {"sleep": JOB_S, "n": 1})
    assert farm.stop(timeout_s=JOB_S + 30) == 0
    assert b"did not stop in time" not in farm.log()
    farm.start()  # same data directory: the job's record is there
    assert job(farm, location) == {
        "job_id": location.rsplit("/", 1)[1],
        "status": "finished",
        "result": {"sleep": JOB_S, "n": 1},
    }
