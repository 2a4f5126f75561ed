"""What docs/tutorial.md's "Asynchronous jobs" section promises, through the in-process gateway and a real redis-server.

- ``Prefer: respond-async`` is checked like any POST: 503 for a deployment scaled to 0 (``num_replicas: 0``),
  while an autoscaled one at 0 replicas queues (docs/api.md's HTTP table: "an autoscaled one at 0 replicas queues").
- A finished or failed job keeps its status for ``STREAMSERVE_JOB_RESULT_TTL_S``; after that its URL is 404.
- A job whose worker was killed mid-call with no scheduler on its host to see it (the docs: "Job workers on
  other hosts are left to RQ") stays ``started`` until RQ's registry maintenance finds its heartbeat expired,
  "a minute after its timeout" (the call's timeout plus 30 s), and fails it with ``AbandonedJobError``.
  (With a scheduler, tests/e2e/test_job_workers_stop.py: it fails at once.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from rq import Queue
from rq.registry import StartedJobRegistry

from streamserve.client import AsyncClient
from streamserve.client.jobs import JOB_SERIALIZER
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import UnavailableError
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.workers import job_function
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy
from tests.integration.test_gateway_app import wait_for_routes
from tests.integration.test_jobs import ThreadWorker

RESULT_TTL_S = 2
PREFER_ASYNC = {"Prefer": "respond-async"}
RQ = str(Path(sys.executable).with_name("rq"))
RunJobs = Callable[[], Coroutine[Any, Any, None]]


def rq_queue(connection: redis.Redis, settings: Settings) -> Queue:
    return Queue(settings.keys.jobs_queue(), connection=connection, serializer=JOB_SERIALIZER)


@pytest.fixture
def run_jobs(settings: Settings, connection: redis.Redis) -> Iterator[RunJobs]:
    """run() works off every queued job on a thread of this process (the in-process replica keeps serving)."""
    job_function.configure(settings)

    def burst() -> None:
        queue = rq_queue(connection, settings)
        ThreadWorker([queue], connection=connection, serializer=JOB_SERIALIZER).work(burst=True)

    async def run() -> None:
        await asyncio.wait_for(asyncio.to_thread(burst), timeout=30)

    yield run
    job_function.close()


async def job_body(http: httpx.AsyncClient, location: str) -> tuple[int, dict[str, Any]]:
    resp = await http.get(location)
    return resp.status_code, resp.json()


# -- 503 at 0 replicas ------------------------------------------------------------------------------------


async def test_respond_async_to_a_deployment_scaled_to_zero_is_503_and_queues_no_job(
    http: httpx.AsyncClient, client: AsyncClient, settings: Settings, connection: redis.Redis
) -> None:
    await deploy(settings, num_replicas=0, route_prefix="/zero")
    await wait_for_routes(http)
    resp = await http.post("/zero", json={"a": 1}, headers=PREFER_ASYNC)
    assert resp.status_code == 503
    assert resp.json()["error"] == "UnavailableError"
    assert "location" not in resp.headers
    with pytest.raises(UnavailableError):  # the client's submit_job "checks like call()"
        await client.submit_job("rec", {"a": 1})
    assert rq_queue(connection, settings).count == 0


async def test_respond_async_to_an_autoscaled_deployment_at_zero_replicas_is_queued(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    scale_to_zero = {"min_replicas": 0, "max_replicas": 2}
    await deploy(settings, autoscaling_config=scale_to_zero, route_prefix="/lazy")
    await wait_for_routes(http)
    resp = await http.post("/lazy", json={"a": 1}, headers=PREFER_ASYNC)
    assert resp.status_code == 202
    assert resp.json() == {"job_id": resp.json()["job_id"], "status": "queued"}


# -- the result TTL -----------------------------------------------------------------------------------------


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"job_result_ttl_s": RESULT_TTL_S})


@pytest.mark.parametrize(("method", "status"), [("", "finished"), ("boom", "failed")])
async def test_an_ended_job_answers_404_once_its_result_ttl_passed(
    start_replica: StartReplica,
    http: httpx.AsyncClient,
    client: AsyncClient,
    run_jobs: RunJobs,
    method: str,
    status: str,
) -> None:
    await start_replica(route_prefix="/rec")
    location = f"/-/jobs/{await client.submit_job('rec', 7, method=method)}"
    worker = asyncio.create_task(run_jobs())
    seen: dict[str, Any] = {}
    ended_at = 0.0

    async def ended() -> bool:
        nonlocal ended_at
        code, body = await job_body(http, location)
        seen.update(body)
        ended_at = time.monotonic()
        return code == 200 and body["status"] in ("finished", "failed")

    try:
        await wait_for_async(ended, 15, lambda: f"the job never ended: {seen}")
    finally:
        await worker
    assert seen["status"] == status, seen

    async def gone() -> bool:
        code, _ = await job_body(http, location)
        return code == 404

    await wait_for_async(gone, RESULT_TTL_S + 5, f"GET {location} still answers 200, {RESULT_TTL_S} s TTL + 5 s later")
    assert time.monotonic() - ended_at > RESULT_TTL_S / 2  # kept for about the TTL, not dropped at once
    code, body = await job_body(http, location)
    assert code == 404 and body["error"] == "NotFoundError"


# -- a job whose worker was killed ---------------------------------------------------------------------------

CALL_TIMEOUT_S = 5
# docs/tutorial.md: "RQ bounds a job's run at the call's timeout plus 30 s".
README_JOB_TIMEOUT_S = CALL_TIMEOUT_S + 30
# docs/tutorial.md: its heartbeat expires "a minute after its timeout".
README_ABANDONED_AFTER_S = README_JOB_TIMEOUT_S + 60


async def test_a_job_whose_worker_dies_unwatched_stays_started_until_maintenance_fails_it_as_abandoned(
    gate: None,
    start_replica: StartReplica,
    http: httpx.AsyncClient,
    processes: Processes,
    aredis: aioredis.Redis,
    settings: Settings,
    connection: redis.Redis,
) -> None:
    await start_replica(import_path="tests.deployments:gate", route_prefix="/rec", request_timeout_s=CALL_TIMEOUT_S)
    await wait_for_routes(http)
    submitted = time.time()
    resp = await http.post("/rec", json="held", headers=PREFER_ASYNC)
    assert resp.status_code == 202
    location = resp.headers["location"]
    worker = processes.spawn("job-worker", "job-worker")

    async def running_on_the_replica() -> bool:
        _code, body = await job_body(http, location)
        pending = await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP)
        return bool(body["status"] == "started" and pending["pending"] == 1)

    await wait_for_async(
        running_on_the_replica, 30, lambda: f"the job never ran:\n{processes.log('job-worker').read_text()}"
    )
    started = time.time()
    worker.kill()  # SIGKILL, mid-call
    await asyncio.to_thread(worker.wait, 10)

    assert await job_body(http, location) == (200, {"job_id": location.rsplit("/", 1)[1], "status": "started"})
    info = await asyncio.to_thread(
        subprocess.run, [RQ, "info", "--url", settings.effective_redis_url], capture_output=True, timeout=30
    )
    assert info.returncode == 0, info.stderr
    assert (await job_body(http, location))[1]["status"] == "started"  # its heartbeat has not expired yet

    registry = StartedJobRegistry(queue=rq_queue(connection, settings))
    # RQ's maintenance, run as if at a later time: just before the heartbeat can have expired, then just after.
    await asyncio.to_thread(registry.cleanup, submitted + README_ABANDONED_AFTER_S - 1)
    assert (await job_body(http, location))[1]["status"] == "started"
    await asyncio.to_thread(registry.cleanup, started + README_ABANDONED_AFTER_S + 1)
    code, body = await job_body(http, location)
    assert code == 200 and body["status"] == "failed", body
    assert "AbandonedJobError" in json.dumps(body["error"]), body
