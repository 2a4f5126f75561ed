"""Whoever can write to Redis cannot make a job worker run a function of their choosing (issue 27, defect 3).

- A job enqueued by hand with stock RQ, naming ``os.system``, or naming our function with callbacks attached, fails
  in a real ``streamserve job-worker`` without running: the job says why, the worker's log says so, and the worker
  goes on serving real jobs.
- The job pool's sweep, which fails the jobs of job workers that died, runs none of their callbacks either.
- With ``STREAMSERVE_IMPORT_ALLOW`` set, a job for a deployment (or an endpoint) that imports from outside it fails
  with the ConfigError a write of that deployment gets, and never reaches its replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Callback, Queue
from rq.job import JobStatus as RQJobStatus
from rq.timeouts import TimerDeathPenalty

from streamserve.client import AsyncClient
from streamserve.client.jobs import ABANDONED_ERROR, JOB_FUNCTION, JOB_SERIALIZER, JobQueue
from streamserve.runtime.settings import Settings
from streamserve.wire.states import JobStatus
from streamserve.workers import job_function
from streamserve.workers.job_worker import JobWorker
from tests import deployments
from tests.harness.farm import Processes
from tests.integration.conftest import StartReplica
from tests.integration.test_jobs import wait_for_status

RunJobs = Callable[[Settings], Coroutine[Any, Any, None]]
LEAVE_MARK = "tests.job_callbacks.leave_mark"


def stock_rq_queue(connection: redis.Redis, settings: Settings) -> Queue:
    """The queue our job workers read, as anyone with stock RQ and the farm's Redis URL can write to it."""
    return Queue(settings.keys.jobs_queue(), connection=connection, serializer=JOB_SERIALIZER)


async def test_a_job_worker_runs_no_function_but_ours(
    start_replica: StartReplica,
    client: AsyncClient,
    processes: Processes,
    connection: redis.Redis,
    settings: Settings,
    tmp_path: Path,
) -> None:
    await start_replica()
    pwned, marked = tmp_path / "pwned.txt", tmp_path / "marked.txt"
    queue = stock_rq_queue(connection, settings)
    evil = queue.enqueue_call("os.system", args=(f"touch {pwned}",))
    hooked = queue.enqueue_call(
        JOB_FUNCTION,
        args=("rec", "hooked"),
        on_success=Callback(LEAVE_MARK),
        on_failure=Callback(LEAVE_MARK),
        meta={"mark": str(marked)},
    )
    worker = processes.spawn("job-worker", "job-worker")
    try:
        await refused_then_served(client, evil.id, hooked.id)
        assert worker.poll() is None
    finally:
        # By id: its title (RQ's) overwrites the environment that stop_all finds its processes by.
        processes.stop("job-worker")
    assert not pwned.exists() and not marked.exists()
    assert "hooked" not in deployments.CALLS
    log = processes.log("job-worker").read_text()
    assert f"job {evil.id} refused, it fails without running: it names 'os.system'" in log
    assert f"job {hooked.id} refused, it fails without running: it carries callbacks" in log


async def refused_then_served(client: AsyncClient, evil: str, hooked: str) -> None:
    """Both jobs fail with the reason; a job of ours queued after them is served."""
    refused = await wait_for_status(client, evil, JobStatus.FAILED, timeout_s=30)
    assert refused.error == {
        "error": "JobRefusedError",
        "message": f"job {evil} refused: it names 'os.system', not '{JOB_FUNCTION}'",
    }
    refused_hooks = await wait_for_status(client, hooked, JobStatus.FAILED, timeout_s=30)
    assert refused_hooks.error is not None and refused_hooks.error["error"] == "JobRefusedError"
    assert f"it carries callbacks ('{LEAVE_MARK}'" in refused_hooks.error["message"]

    job_id = await client.submit_job("rec", {"after": "refusals"})  # the worker goes on serving ours
    done = await wait_for_status(client, job_id, JobStatus.FINISHED, timeout_s=30)
    assert done.result == {"tag": "rec", "body": {"after": "refusals"}, "config": None}


def test_the_sweep_of_dead_workers_jobs_runs_no_callback(
    connection: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    """Stock RQ's cleanup of a started job whose worker is gone calls the job's failure callback; ours does not."""
    marked = tmp_path / "marked.txt"
    queue = stock_rq_queue(connection, settings)
    job = queue.enqueue_call(JOB_FUNCTION, args=("rec", 1), on_failure=Callback(LEAVE_MARK), meta={"mark": str(marked)})
    # As a job worker that died mid-job leaves its job: started, by that worker, in the started registry.
    job.worker_name = "gone"
    job.save()
    job.set_status(RQJobStatus.STARTED)
    connection.zadd(queue.started_job_registry.key, {f"{job.id}:an-execution": 2_000_000_000})
    jobs = JobQueue(connection, settings.keys, settings.job_result_ttl_s)
    assert jobs.fail_abandoned(lambda worker: worker == "gone") == [job.id]
    error = jobs.info(job.id).error
    assert error is not None and error["error"] == ABANDONED_ERROR
    assert not marked.exists()


class ThreadJobWorker(JobWorker):
    """Our job worker, runnable off the main thread: no signal handlers, a timer instead of SIGALRM."""

    death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        pass


@pytest.fixture
def run_jobs(connection: redis.Redis) -> Iterator[RunJobs]:
    """run(settings) works off every queued job in our job worker, on a thread, with those settings."""

    async def run(settings: Settings) -> None:
        job_function.configure(settings)
        worker = ThreadJobWorker(
            [stock_rq_queue(connection, settings)], connection=connection, serializer=JOB_SERIALIZER
        )
        await asyncio.wait_for(asyncio.to_thread(worker.work, burst=True), timeout=30)

    yield run
    job_function.close()


async def test_a_job_for_a_deployment_outside_the_allow_list_fails_with_the_reason(
    start_replica: StartReplica, client: AsyncClient, run_jobs: RunJobs, settings: Settings
) -> None:
    await start_replica()  # tests.deployments:Recorder, written with no allow-list
    await client.set_traffic("split", {"rec": 1})
    calls_before = len(deployments.CALLS)
    direct = await client.submit_job("rec", "direct")
    via_endpoint = await client.submit_job("split", "via endpoint")
    await run_jobs(settings.model_copy(update={"import_allow": "examples"}))

    reason = "deployment 'rec': import_path 'tests.deployments:Recorder' is outside STREAMSERVE_IMPORT_ALLOW (examples)"
    for job_id in (direct, via_endpoint):
        info = await client.job(job_id)
        assert info.status is JobStatus.FAILED
        assert info.error == {"error": "ConfigError", "message": reason}
    assert len(deployments.CALLS) == calls_before  # the replica never got either call

    allowed = await client.submit_job("split", "allowed")
    await run_jobs(settings.model_copy(update={"import_allow": "tests,examples"}))
    info = await client.job(allowed)
    assert info.status is JobStatus.FINISHED and info.result["body"] == "allowed"
