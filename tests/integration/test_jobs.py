"""Asynchronous jobs: RQ jobs that call an in-process replica, run by an RQ worker on a thread of the test."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Awaitable, Callable, Iterator

import httpx
import orjson
import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.timeouts import TimerDeathPenalty
from rq.worker import SimpleWorker

from streamserve.client import AsyncClient
from streamserve.client.jobs import JOB_FUNCTION, JOB_SERIALIZER, JobInfo, JobQueue
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import BadRequestError, IdempotencyKeyMismatchError, NotFoundError
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import now_ms
from streamserve.wire.states import JobStatus
from streamserve.workers import job_function
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica
from tests.integration.test_gateway_app import wait_for_routes

JOB_TTL_S = 321
RunJobs = Callable[[], Awaitable[None]]


class ThreadWorker(SimpleWorker):
    """RQ's SimpleWorker, runnable off the main thread: no signal handlers, a timer instead of SIGALRM."""

    death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        pass


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"job_result_ttl_s": JOB_TTL_S})


@pytest.fixture
def run_jobs(settings: Settings) -> Iterator[RunJobs]:
    """run() works off every queued job (in a thread, so the in-process replica keeps serving), then returns."""
    job_function.configure(settings)
    connection = redis.Redis.from_url(settings.effective_redis_url)

    def burst() -> None:
        queue = Queue(settings.keys.jobs_queue(), connection=connection, serializer=JOB_SERIALIZER)
        ThreadWorker([queue], connection=connection, serializer=JOB_SERIALIZER).work(burst=True)

    async def run() -> None:
        await asyncio.wait_for(asyncio.to_thread(burst), timeout=30)

    yield run
    job_function.close()
    connection.close()


async def wait_for_status(client: AsyncClient, job_id: str, status: JobStatus, timeout_s: float = 10.0) -> JobInfo:
    last: list[JobInfo] = []

    async def reached() -> bool:
        last[:] = [await client.job(job_id)]
        return last[0].status is status

    await wait_for_async(reached, timeout_s, lambda: f"job still {last[0].status}, never {status}")
    return last[0]


def test_the_job_function_is_importable_by_its_dotted_path() -> None:
    module, _, name = JOB_FUNCTION.rpartition(".")
    assert module == job_function.__name__ and getattr(job_function, name) is job_function.run


async def test_job_calls_the_replica_and_keeps_its_result_for_the_ttl(
    start_replica: StartReplica, client: AsyncClient, run_jobs: RunJobs, settings: Settings
) -> None:
    await start_replica()
    runs_before = deployments.CALLS.count({"x": [1, 2]})
    job_id = await client.submit_job("rec", {"x": [1, 2]})
    assert await client.job(job_id) == JobInfo(job_id, JobStatus.QUEUED)
    assert deployments.CALLS.count({"x": [1, 2]}) == runs_before  # queued: the replica has not run it yet
    await run_jobs()
    info = await client.job(job_id)
    assert info.status is JobStatus.FINISHED
    assert info.result == {"tag": "rec", "body": {"x": [1, 2]}, "config": None}
    assert info.to_json() == {"job_id": job_id, "status": "finished", "result": info.result}
    # The replica's handler ran the job's call exactly once, through the request stream (which it left empty).
    assert deployments.CALLS.count({"x": [1, 2]}) == runs_before + 1
    connection = redis.Redis.from_url(settings.effective_redis_url)
    try:
        stream = connection.xinfo_stream(settings.keys.requests("rec"))
        assert stream["last-generated-id"] != b"0-0" and stream["length"] == 0  # went through it, then deleted
        assert connection.xpending(settings.keys.requests("rec"), CONSUMER_GROUP)["pending"] == 0
        job = Job.fetch(job_id, connection=connection, serializer=JOB_SERIALIZER)
        assert job.result_ttl == JOB_TTL_S
        assert 0 < connection.ttl(job.key) <= JOB_TTL_S
        # Nothing RQ stored for the job is pickled: its payload (which RQ compresses) is JSON.
        data = connection.hget(job.key, "data")
        assert isinstance(data, bytes)
        assert json.loads(zlib.decompress(data)) == [
            JOB_FUNCTION,
            None,
            ["rec", {"x": [1, 2]}, "", None, "normal", "default"],
            {},
        ]
    finally:
        connection.close()


async def test_a_failed_job_carries_the_user_error(
    start_replica: StartReplica, client: AsyncClient, run_jobs: RunJobs
) -> None:
    await start_replica()
    job_id = await client.submit_job("rec", 7, method="boom")
    await run_jobs()
    info = await client.job(job_id)
    assert info.status is JobStatus.FAILED
    assert info.error == {"error": "ValueError", "message": "boom: 7"}
    assert info.to_json() == {"job_id": job_id, "status": "failed", "error": info.error}


async def test_a_job_is_started_while_its_call_runs(
    start_replica: StartReplica, client: AsyncClient, run_jobs: RunJobs
) -> None:
    deployments.GATE = asyncio.Event()
    await start_replica(import_path="tests.deployments:gate")
    job_id = await client.submit_job("rec", "through")
    worker = asyncio.create_task(run_jobs())
    try:
        await wait_for_status(client, job_id, JobStatus.STARTED)
    finally:
        deployments.GATE.set()
        await worker
    assert (await client.job(job_id)).result == "through"


async def test_submit_job_checks_its_input_like_a_call(start_replica: StartReplica, client: AsyncClient) -> None:
    await start_replica()
    with pytest.raises(NotFoundError):
        await client.submit_job("nothing", 1)
    with pytest.raises(BadRequestError):
        await client.submit_job("rec", {1, 2})
    with pytest.raises(NotFoundError):
        await client.job("no-such-job")
    with pytest.raises(NotFoundError):
        await client.job("../../etc")
    with pytest.raises(NotFoundError, match=r"^no job 'aaa.*\.\.\. \(5000 characters\) \(not a job id\)$"):
        await client.job("a" * 5000)  # (its 404 echoed all 5,000)
    for not_an_id in (None, 7):
        with pytest.raises(BadRequestError, match="a job id is a string"):
            await client.job(not_an_id)  # type: ignore[arg-type]
        with pytest.raises(BadRequestError, match="a job id is a string"):
            await client.cancel_job(not_an_id)  # type: ignore[arg-type]


async def test_gateway_answers_prefer_respond_async_with_202_and_the_job_url(
    start_replica: StartReplica, http: httpx.AsyncClient, run_jobs: RunJobs
) -> None:
    await start_replica(route_prefix="/rec")
    await wait_for_routes(http)
    resp = await http.post("/rec", json={"a": 1}, headers={"Prefer": "wait=5, respond-async"})
    assert resp.status_code == 202
    job_id = resp.json()["job_id"]
    assert resp.json() == {"job_id": job_id, "status": "queued"}
    assert resp.headers["location"] == f"/-/jobs/{job_id}"
    assert resp.headers["preference-applied"] == "respond-async"
    assert (await http.get(resp.headers["location"])).json() == {"job_id": job_id, "status": "queued"}
    await run_jobs()
    done = (await http.get(resp.headers["location"])).json()
    assert done == {"job_id": job_id, "status": "finished", "result": {"tag": "rec", "body": {"a": 1}, "config": None}}


async def test_gateway_checks_an_async_post_like_any_other(
    start_replica: StartReplica, http: httpx.AsyncClient, settings: Settings
) -> None:
    await start_replica(route_prefix="/rec")
    await wait_for_routes(http)
    prefer = {"Prefer": "respond-async"}
    assert (await http.post("/nothing", json=1, headers=prefer)).status_code == 404
    bad = await http.post("/rec", content=b"{nope", headers=prefer)
    assert bad.status_code == 400 and bad.json()["error"] == "BadRequestError"
    big = b"1" * (settings.max_request_bytes + 1)
    assert (await http.post("/rec", content=big, headers=prefer)).status_code == 413
    unknown = await http.get("/-/jobs/no-such-job")
    assert unknown.status_code == 404 and unknown.json()["error"] == "NotFoundError"


def test_a_key_whose_job_lapsed_queues_a_new_job_whatever_its_body(settings: Settings) -> None:
    """docs/retries-and-caching.md: once the job's result has expired, the key queues a new job, as a key past its TTL
    would; it was a 422 for another body for the rest of the key's day."""
    connection = redis.Redis.from_url(settings.effective_redis_url)
    try:
        queue = JobQueue(connection, settings.keys, result_ttl_s=5)
        claim = settings.keys.job_idempotency("rec", "k-lapsed")
        lapsed = orjson.dumps(["job-that-lapsed", "digest-of-the-first-body", now_ms() - 60_000])
        connection.set(claim, lapsed, px=86_400_000)
        assert queue._claim(claim, "k-lapsed", "new-job", "digest-of-another-body", 86_400) is None
        assert orjson.loads(connection.get(claim) or b"")[0] == "new-job"
        connection.set(claim, orjson.dumps(["new-job", "d1", now_ms()]))  # a job claimed just now: on its way
        with pytest.raises(IdempotencyKeyMismatchError):
            queue._claim(claim, "k-lapsed", "third-job", "d2", 86_400)
    finally:
        connection.close()
