"""Asynchronous jobs end to end: `streamserve up` runs the job workers; HTTP, the client and `rq info` see the jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamserve import Client
from tests.e2e.farm import Farm, wait_for

RQ = str(Path(sys.executable).with_name("rq"))

pytestmark = pytest.mark.e2e


def finished(farm: Farm, location: str) -> dict[str, Any]:
    """Poll the job's URL (bounded) until it is finished or failed."""
    seen: dict[str, Any] = {}

    def done() -> bool:
        seen.update(httpx.get(farm.base_url + location, timeout=10).json())
        return seen["status"] in ("finished", "failed")

    wait_for(done, 30, f"job never ended: {seen}")
    return seen


def test_prefer_respond_async_answers_202_and_the_job_url_shows_the_result(farm: Farm) -> None:
    resp = farm.post("/echo", {"x": 1}, headers={"Prefer": "respond-async"})
    assert resp.status_code == 202
    job_id = resp.json()["job_id"]
    assert resp.headers["location"] == f"/-/jobs/{job_id}"
    body = finished(farm, resp.headers["location"])
    assert body == {"job_id": job_id, "status": "finished", "result": {"echo": {"x": 1}, "greeting": "hi"}}


def test_a_failing_job_shows_the_users_error(farm: Farm) -> None:
    resp = farm.post("/add", {"a": 1}, headers={"Prefer": "respond-async"})
    assert resp.status_code == 202
    body = finished(farm, resp.headers["location"])
    assert body["status"] == "failed"
    assert body["error"] == {"error": "KeyError", "message": "'b'"}


def test_client_submit_job_and_rq_info_lists_the_queue(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        job_id = client.submit_job("add", {"a": 2, "b": 3})
        wait_for(lambda: client.job(job_id).status.value == "finished", 30, "job never finished")
        assert client.job(job_id).result == {"sum": 5}
    out = ""

    def rq_info_shows_the_queue_and_pool() -> bool:
        nonlocal out
        cmd = [RQ, "info", "--url", farm.effective_redis_url]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        return "streamserve:jobs" in out and "2 workers" in out

    wait_for(rq_info_shows_the_queue_and_pool, 20, f"rq info does not show the queue and its 2 workers:\n{out}")
