"""``max_queued_jobs``: a deployment accepts that many asynchronous jobs that have not ended, and refuses the rest at
once (OverloadedError; 503 with Retry-After over HTTP), with nothing queued for them. A job that ends frees its place;
one that ended without saying so (its worker gone, deleted by hand) is uncounted by the job pool's sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
import redis
from rq import Queue
from rq.job import Job

from streamserve.client import AsyncClient
from streamserve.client.jobs import JOB_SERIALIZER, PRUNE_AFTER_MS, JobQueue
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import OverloadedError
from streamserve.wire.messages import now_ms
from streamserve.workers import job_function
from tests.integration.conftest import StartReplica
from tests.integration.test_gateway_app import wait_for_routes
from tests.integration.test_jobs import ThreadWorker

BOUND = 3
PREFER_ASYNC = {"Prefer": "respond-async"}
RunJobs = Callable[[], Coroutine[Any, Any, None]]


@pytest.fixture
def run_jobs(settings: Settings, connection: redis.Redis) -> Iterator[RunJobs]:
    """run() works off every queued job on a thread (the in-process replica keeps serving), then returns."""
    job_function.configure(settings)

    def burst() -> None:
        queue = Queue(settings.keys.jobs_queue(), connection=connection, serializer=JOB_SERIALIZER)
        ThreadWorker([queue], connection=connection, serializer=JOB_SERIALIZER).work(burst=True)

    async def run() -> None:
        await asyncio.wait_for(asyncio.to_thread(burst), timeout=30)

    yield run
    job_function.close()


def queued(connection: redis.Redis, settings: Settings) -> int:
    return int(connection.llen(Queue(settings.keys.jobs_queue(), connection=connection).key))


async def submit_many(client: AsyncClient, n: int) -> tuple[list[str], list[OverloadedError]]:
    """``n`` submissions at once: the job ids accepted, and the refusals."""
    results = await asyncio.gather(*(client.submit_job("rec", {"n": i}) for i in range(n)), return_exceptions=True)
    unexpected = [r for r in results if isinstance(r, BaseException) and not isinstance(r, OverloadedError)]
    assert unexpected == []
    return [r for r in results if isinstance(r, str)], [r for r in results if isinstance(r, OverloadedError)]


async def test_a_deployment_accepts_max_queued_jobs_and_refuses_the_rest_at_once(
    start_replica: StartReplica, client: AsyncClient, settings: Settings, connection: redis.Redis
) -> None:
    await start_replica(max_queued_jobs=BOUND)
    accepted, refused = await submit_many(client, 20)
    assert len(accepted) == BOUND and len(refused) == 20 - BOUND
    assert "'rec' has 3 jobs queued or running (max_queued_jobs)" in str(refused[0])
    assert queued(connection, settings) == BOUND  # nothing was queued for the refused ones
    assert {(await client.job(job_id)).status.value for job_id in accepted} == {"queued"}


async def test_over_http_the_refusal_is_503_with_retry_after(
    start_replica: StartReplica, http: httpx.AsyncClient, settings: Settings, connection: redis.Redis
) -> None:
    await start_replica(max_queued_jobs=BOUND, route_prefix="/rec")
    await wait_for_routes(http)
    answers = [await http.post("/rec", json=i, headers=PREFER_ASYNC) for i in range(BOUND + 2)]
    assert [a.status_code for a in answers] == [202] * BOUND + [503, 503]
    refused = answers[-1]
    assert refused.json()["error"] == "OverloadedError" and "max_queued_jobs" in refused.json()["message"]
    assert refused.headers["retry-after"] == "1" and refused.headers["x-request-id"]
    assert queued(connection, settings) == BOUND
    # A direct call is bounded by max_queued_requests, not by the jobs: it is still served.
    assert (await http.post("/rec", json="now")).status_code == 200


async def test_a_job_that_ends_frees_its_place(
    start_replica: StartReplica, client: AsyncClient, run_jobs: RunJobs
) -> None:
    await start_replica(max_queued_jobs=BOUND)
    first, _ = await submit_many(client, BOUND + 1)
    await run_jobs()
    assert {(await client.job(job_id)).status.value for job_id in first} == {"finished"}
    again, refused = await submit_many(client, BOUND + 1)
    assert len(again) == BOUND and len(refused) == 1


async def test_a_failed_job_frees_its_place_too(
    start_replica: StartReplica, client: AsyncClient, run_jobs: RunJobs
) -> None:
    await start_replica(max_queued_jobs=1)
    failed = await client.submit_job("rec", 1, method="boom")
    with pytest.raises(OverloadedError):
        await client.submit_job("rec", 2)
    await run_jobs()
    assert (await client.job(failed)).status.value == "failed"
    assert await client.submit_job("rec", 3)


async def test_the_sweep_uncounts_jobs_that_ended_without_saying_so(
    start_replica: StartReplica, client: AsyncClient, settings: Settings, connection: redis.Redis
) -> None:
    await start_replica(max_queued_jobs=BOUND)
    kept, deleted, young = await client.submit_job("rec", 1), await client.submit_job("rec", 2), "not-queued-yet"
    counted = settings.keys.accepted_jobs("rec")
    long_ago = now_ms() - 2 * PRUNE_AFTER_MS
    connection.zadd(counted, {kept: long_ago, deleted: long_ago, young: now_ms()})
    Job.fetch(deleted, connection=connection, serializer=JOB_SERIALIZER).delete()  # by hand, say `rq empty`
    with pytest.raises(OverloadedError):
        await client.submit_job("rec", 3)
    jobs = JobQueue(connection, settings.keys, settings.job_result_ttl_s)
    assert jobs.prune_counts() == 1
    # Still counted: the queued job, and the young count (counted a moment ago, its job maybe not queued yet).
    assert {m.decode() for m in connection.zrange(counted, 0, -1)} == {kept, young}
    assert await client.submit_job("rec", 4)
