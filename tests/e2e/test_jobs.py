"""Asynchronous jobs end to end: `streamserve up` runs the job workers; HTTP, the client and `rq info` see the jobs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from rq import Queue, Worker

from streamserve import Client
from streamserve.wire.keys import Keys
from tests.harness.farm import Farm, pids_with_marker
from tests.harness.waiting import wait_for

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


def test_a_result_nested_as_deep_as_json_carries_is_read_back(farm: Farm) -> None:
    """254 levels (json_values.MAX_DEPTH): echo's answer to 253; the job's JSON around it was one level too many for
    the encoder, a 500 in plain text."""
    deep = b"[" * 253 + b"]" * 253
    resp = farm.post("/echo", content=deep, headers={"Prefer": "respond-async", "Content-Type": "application/json"})
    assert resp.status_code == 202, resp.text
    body = finished(farm, resp.headers["location"])
    assert body["status"] == "finished", body
    depth, value = 0, body["result"]["echo"]
    while value:
        depth, value = depth + 1, value[0]
    assert depth == 252  # the outermost list holds 252 more


def test_a_failing_job_shows_the_users_error(farm: Farm) -> None:
    resp = farm.post("/add", {"a": 1}, headers={"Prefer": "respond-async"})
    assert resp.status_code == 202
    body = finished(farm, resp.headers["location"])
    assert body["status"] == "failed"
    assert body["error"] == {"error": "KeyError", "message": "'b'"}
    # Its job worker says so in one line (RQ's own record was the job function's traceback, as one line of KB).
    job_id = resp.json()["job_id"]
    told = f"job {job_id} failed: RemoteError:"
    wait_for(lambda: told in farm.log().decode(), 10, f"no line saying {told!r}")
    assert f"job {job_id}: exception raised while executing" not in farm.log().decode()


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


def job_worker_pids(farm: Farm) -> set[int]:
    pids = set()
    for pid in pids_with_marker(farm.token):
        with contextlib.suppress(OSError):
            if b"\0job-worker\0" in Path(f"/proc/{pid}/cmdline").read_bytes() + b"\0":
                pids.add(pid)
    return pids


def test_the_scheduler_restarts_a_job_worker_that_dies(farm: Farm) -> None:
    """Runs last in this module: the killed worker's record stays in `rq info` until RQ expires it."""
    before = job_worker_pids(farm)
    assert len(before) == 2
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(job_worker_pids(farm) - {victim}) == 2, 30, "the dead job worker was not replaced")
    [new] = job_worker_pids(farm) - before
    connection = redis.Redis.from_url(farm.effective_redis_url)
    try:
        queue = Queue(Keys().jobs_queue(), connection=connection)
        # Ready once it has registered with RQ (so it is not still starting up when the next tests run).
        wait_for(lambda: any(w.pid == new for w in Worker.all(queue=queue)), 30, "the new job worker never registered")
    finally:
        connection.close()
    resp = farm.post("/echo", "again", headers={"Prefer": "respond-async"})
    assert finished(farm, resp.headers["location"])["status"] == "finished"
