"""A job worker asked to stop finishes the job it runs, however many SIGTERMs follow the first, and the job it took
in the moment the stop came.

Under `up`, a job worker gets SIGTERM twice: from `up`, to the scheduler's process group, and from the job pool once
the scheduler's loop gets there. RQ makes a second one that comes more than a second after the first a cold
shutdown, which fails the job; a job worker's hard stop is SIGKILL, at the end of the drain (issue 26).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import redis
import redis.asyncio as aioredis
from rq.job import Job
from rq.worker import Worker

from streamserve.client.jobs import JOB_SERIALIZER, JobQueue
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.scheduler.job_pool import JobWorkerPool
from streamserve.wire.keys import CONSUMER_GROUP
from tests import deployments
from tests.harness.farm import Processes, marked_env
from tests.harness.paths import ROOT, STREAMSERVE, python_path
from tests.harness.waiting import wait_for, wait_for_async
from tests.integration.conftest import StartReplica
from tests.integration.test_gateway_app import wait_for_routes
from tests.integration.test_job_promises import PREFER_ASYNC, job_body

# RQ ignores a second SIGTERM this soon after the first.
RQ_REPEAT_WINDOW = timedelta(seconds=1)


def stop_requested_at(connection: redis.Redis, job_id: str) -> datetime | None:
    """When the worker running ``job_id`` took its stop request, as RQ records it."""
    job = Job.fetch(job_id, connection=connection, serializer=JOB_SERIALIZER)
    worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + str(job.worker_name), connection=connection)
    return worker.shutdown_requested_date if worker is not None else None


async def test_a_second_sigterm_a_while_after_the_first_still_lets_the_job_finish(
    gate: None,
    start_replica: StartReplica,
    http: httpx.AsyncClient,
    processes: Processes,
    aredis: aioredis.Redis,
    settings: Settings,
    connection: redis.Redis,
) -> None:
    await start_replica(import_path="tests.deployments:gate", route_prefix="/rec")
    await wait_for_routes(http)
    resp = await http.post("/rec", json="held", headers=PREFER_ASYNC)
    assert resp.status_code == 202
    location = resp.headers["location"]
    job_id = location.rsplit("/", 1)[1]
    worker = processes.spawn("job-worker", "job-worker")

    async def running_on_the_replica() -> bool:
        _code, body = await job_body(http, location)
        pending = await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP)
        return bool(body["status"] == "started" and pending["pending"] == 1)

    await wait_for_async(running_on_the_replica, 30, lambda: processes.log("job-worker").read_text())
    worker.send_signal(signal.SIGTERM)  # `up`'s, to the scheduler's process group

    async def past_rqs_repeat_window() -> bool:
        taken = await asyncio.to_thread(stop_requested_at, connection, job_id)
        return taken is not None and datetime.now(UTC) - taken > RQ_REPEAT_WINDOW

    await wait_for_async(past_rqs_repeat_window, 10, "the job worker never recorded its stop request")
    worker.send_signal(signal.SIGTERM)  # the job pool's, once the scheduler's tick is over
    deployments.GATE.set()  # the call returns
    await asyncio.to_thread(worker.wait, 20)
    assert await job_body(http, location) == (200, {"job_id": job_id, "status": "finished", "result": "held"})
    assert worker.returncode == 0


async def test_a_sigterm_the_moment_an_idle_job_worker_takes_a_job_lets_that_job_run(
    start_replica: StartReplica, http: httpx.AsyncClient, processes: Processes, tmp_path: Path
) -> None:
    """RQ raises StopRequested from the signal handler of an idle worker, wherever it is: after Redis had moved the
    job to the worker, the job stayed 'queued', in no queue (a Ctrl-C under `up` lost one so, in CI)."""
    await start_replica(import_path="tests.deployments:crash_on", route_prefix="/echo")
    await wait_for_routes(http)
    log = tmp_path / "signalled-job-worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [".venv/bin/python", "-m", "tests.integration.signalled_job_worker"],
            cwd=ROOT,
            env={**processes.env(), "PYTHONPATH": python_path()},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    processes.started["signalled-job-worker"] = worker  # killed at the end by the fixture, whatever happens
    wait_for(lambda: b"serving queue" in log.read_bytes() or worker.poll() is not None, 30, log.read_text)
    resp = await http.post("/echo", json={"n": 1}, headers=PREFER_ASYNC)  # taken by a worker already waiting
    assert resp.status_code == 202, resp.text
    assert await asyncio.to_thread(worker.wait, 30) == 0, log.read_text()
    _code, body = await job_body(http, resp.headers["location"])
    assert body["status"] == "finished" and body["result"] == {"n": 1}, (body, log.read_text())


async def test_a_job_whose_worker_was_killed_between_taking_and_starting_it_runs(
    start_replica: StartReplica, http: httpx.AsyncClient, processes: Processes, settings: Settings, tmp_path: Path
) -> None:
    """kill -9 after RQ moved the job to its worker and before the worker started it: the job never ran, and sat
    'queued' in RQ's intermediate list, in no queue, until RQ's own cleanup failed it minutes later. The job pool's
    sweep queues it again, and the pool's worker runs it."""
    await start_replica(import_path="tests.deployments:crash_on", route_prefix="/echo")
    await wait_for_routes(http)
    log = tmp_path / "killed-job-worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [".venv/bin/python", "-m", "tests.integration.signalled_job_worker", "SIGKILL"],
            cwd=ROOT,
            env={**processes.env(), "PYTHONPATH": python_path()},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    processes.started["killed-job-worker"] = worker
    wait_for(lambda: b"serving queue" in log.read_bytes() or worker.poll() is not None, 30, log.read_text)
    resp = await http.post("/echo", json={"n": 2}, headers=PREFER_ASYNC)
    assert resp.status_code == 202, resp.text
    assert await asyncio.to_thread(worker.wait, 30) == -signal.SIGKILL, log.read_text()
    jobs = JobQueue(redis.Redis.from_url(settings.effective_redis_url), settings.keys, settings.job_result_ttl_s)
    job_id = resp.headers["location"].rsplit("/", 1)[1]
    assert jobs.connection.lrange(jobs.queue.intermediate_queue_key, 0, -1) == [job_id.encode()]  # stranded
    # Not at first sight: a live worker that has just taken a job starts it within milliseconds.
    assert jobs.requeue_stranded() == ([], True)
    pool = JobWorkerPool(settings.model_copy(update={"job_workers": 1}))
    body: dict[str, object] = {}

    async def finished() -> bool:
        await pool.keep_running()
        body.update((await job_body(http, resp.headers["location"]))[1])
        return body["status"] == "finished"

    try:
        await wait_for_async(finished, 40, lambda: f"{body}; the pool's workers: {pool.pids}", interval_s=0.2)
        assert body["result"] == {"n": 2}
    finally:
        pool.stop()
        await pool.kill()
        pool.close()
        jobs.connection.close()


def test_a_job_worker_whose_redis_is_gone_stops_with_one_line(tmp_path: Path) -> None:
    """Stopped while its Redis is gone (`up` giving up on an embedded Redis that keeps dying), a job worker says so
    in one line and exits 1: RQ's own end needs Redis too, and its error was a traceback."""
    server = EmbeddedRedis(port=free_port()).start()
    log = tmp_path / "job-worker.log"
    env = {**marked_env(uuid.uuid4().hex, {}), **Settings(redis_url=server.url).to_env()}
    with log.open("wb") as out:
        worker = subprocess.Popen([STREAMSERVE, "job-worker"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"serving queue" in log.read_bytes(), 30, "the job worker never started")
        server.stop()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        server.stop()
    text = log.read_text()
    assert "Redis is unreachable" in text and "Traceback" not in text, text


def test_a_job_worker_that_cannot_reach_redis_says_so_in_one_line_and_exits_1() -> None:
    """As the gateway and the replica worker do: no traceback of RQ's worker, which asks Redis as it is made."""
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"  # nothing listens there
    done = subprocess.run(
        [STREAMSERVE, "job-worker", "--redis-url", url], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "job worker" in line and "cannot reach Redis at redis://***@127.0.0.1:" in line, done.stderr
