"""Cancelling an asynchronous job (issue 28, item 3): ``DELETE /-/jobs/{id}`` and ``cancel_job``.

Real redis-server, real ``streamserve job-worker`` processes, an in-process replica (its handler records what it went
through in tests/cancel_job_deployments.py) and the in-process gateway:

- a queued job cancelled never runs, even when a worker takes it as it is cancelled;
- a running job's call is cancelled in the replica (its handler gets CancelledError), and a result that comes after
  the cancel is dropped;
- afterwards the job reads ``canceled`` and no longer counts against ``max_queued_jobs``;
- a job that has ended is 409 (naming its status), an unknown one 404, the write needs the API key, and a jobs' Redis
  that does not answer is 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from pydantic import SecretStr
from rq import Queue
from rq.job import Job
from rq.job import JobStatus as RQJobStatus

from streamserve.client import AsyncClient, Client
from streamserve.client.jobs import ERROR_META, JOB_SERIALIZER, JOB_TIMEOUT_MARGIN_S, JobInfo, settle
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import ConflictError, ForbiddenError, NotFoundError
from streamserve.wire.states import JobStatus
from streamserve.wire.tenants import DEFAULT_TENANT
from streamserve.workers import job_function
from tests import cancel_job_deployments
from tests.cancel_job_deployments import events_of
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, gateway_http
from tests.integration.test_admin_guard import gateway
from tests.integration.test_jobs import ThreadWorker

CANCELLED_MESSAGE = "was cancelled"
# The calls' deadline: far beyond any wait here, so that what stops a held call is its cancel, never its deadline.
CALL_TIMEOUT_S = 300
# How long a cancelled call's handler may take to see it (the job function looks every 0.1 s; the bench
# wants a disconnect to reach a handler within 100 ms at p99): a bound, with room for a loaded machine.
CANCEL_REACHES_HANDLER_S = 5


@pytest.fixture
async def replica(start_replica: StartReplica) -> AsyncIterator[None]:
    """Deployment ``rec`` served by tests.cancel_job_deployments:record; held calls are released at the end."""
    cancel_job_deployments.EVENTS.clear()
    cancel_job_deployments.RELEASE = asyncio.Event()
    await start_replica(import_path="tests.cancel_job_deployments:record", request_timeout_s=CALL_TIMEOUT_S)
    try:
        yield
    finally:
        cancel_job_deployments.RELEASE.set()


def job_worker(processes: Processes) -> None:
    """Start a real ``streamserve job-worker`` (stopped by the ``processes`` fixture)."""
    processes.spawn("job-worker", "job-worker")


async def status_of(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    answer = await http.get(f"/-/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def wait_for_job(http: httpx.AsyncClient, job_id: str, status: str, processes: Processes) -> dict[str, Any]:
    last: list[dict[str, Any]] = [{}]

    async def reached() -> bool:
        last[0] = await status_of(http, job_id)
        return last[0]["status"] == status

    await wait_for_async(
        reached, 30, lambda: f"job is {last[0]}, never {status}:\n{processes.log('job-worker').read_text()}"
    )
    return last[0]


async def wait_for_event(call_id: str, event: str, timeout_s: float = 30) -> None:
    await wait_for_async(
        lambda: event in events_of(call_id),
        timeout_s,
        lambda: f"{call_id} went through {events_of(call_id)}, not {event}",
    )


def counted(connection: redis.Redis, settings: Settings, job_id: str) -> bool:
    """Whether the job counts against deployment rec's max_queued_jobs."""
    return connection.zscore(settings.keys.accepted_jobs("rec"), job_id) is not None


def rq_queue(connection: redis.Redis, settings: Settings) -> Queue:
    return Queue(settings.keys.jobs_queue(), connection=connection, serializer=JOB_SERIALIZER)


def recorded_error(connection: redis.Redis, job_id: str) -> Any:
    return Job.fetch(job_id, connection=connection, serializer=JOB_SERIALIZER).meta.get(ERROR_META)


async def test_a_queued_job_cancelled_never_runs(
    replica: None,
    client: AsyncClient,
    http: httpx.AsyncClient,
    processes: Processes,
    connection: redis.Redis,
    settings: Settings,
) -> None:
    job_id = await client.submit_job("rec", {"id": "cancelled"})
    assert counted(connection, settings, job_id)
    answer = await http.delete(f"/-/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"job_id": job_id, "status": "canceled"}
    assert await status_of(http, job_id) == {"job_id": job_id, "status": "canceled"}
    assert not counted(connection, settings, job_id)
    assert rq_queue(connection, settings).count == 0  # off RQ's queue: no worker takes it
    # The mark expires: after the result TTL, plus the job's time limit (it outlives RQ's record of the job).
    mark_ttl = connection.ttl(settings.keys.job_cancel(job_id))
    assert settings.job_result_ttl_s < mark_ttl <= settings.job_result_ttl_s + CALL_TIMEOUT_S + JOB_TIMEOUT_MARGIN_S
    # A worker now takes the next job: the cancelled one never runs.
    job_worker(processes)
    after = await client.submit_job("rec", {"id": "after"})
    await wait_for_job(http, after, "finished", processes)
    assert events_of("cancelled") == []
    assert await status_of(http, job_id) == {"job_id": job_id, "status": "canceled"}
    # Its record lapses after the result TTL, as a finished job's does; RQ's canceled registry does not keep it.
    assert 0 < connection.ttl(f"rq:job:{job_id}") <= settings.job_result_ttl_s
    assert connection.zscore(f"rq:canceled:{settings.keys.jobs_queue()}", job_id) is None


async def test_a_job_cancelled_as_a_worker_takes_it_fails_without_calling(
    replica: None,
    client: AsyncClient,
    http: httpx.AsyncClient,
    processes: Processes,
    connection: redis.Redis,
    settings: Settings,
) -> None:
    job_id = await client.submit_job("rec", {"id": "taken"})
    # What DELETE does first, with the job still on the queue: a worker taking it at that moment.
    job = Job.fetch(job_id, connection=connection, serializer=JOB_SERIALIZER)
    assert settle(job, settings.keys, JobStatus.CANCELED, settings.job_result_ttl_s)
    job_worker(processes)
    after = await client.submit_job("rec", {"id": "after"})
    await wait_for_job(http, after, "finished", processes)  # one job at a time, in order: "taken" went first
    assert events_of("taken") == []
    assert await status_of(http, job_id) == {"job_id": job_id, "status": "canceled"}
    error = recorded_error(connection, job_id)
    assert error["error"] == "RequestCancelledError" and CANCELLED_MESSAGE in error["message"], error


async def test_a_cancel_that_meets_rqs_own_race_with_a_worker_still_answers_canceled(
    replica: None, client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker takes the job as RQ's cancel looks for it: RQ raised a bare ValueError ("Execution ... not found in
    Redis") to the caller of cancel_job (a 500 over HTTP), though the cancel was made (the worker fails the job)."""
    job_id = await client.submit_job("rec", {"id": "raced"})

    def raced(_job: Job, *args: Any, **kwargs: Any) -> None:
        raise ValueError("Execution 346cea57 not found in Redis")

    monkeypatch.setattr(Job, "cancel", raced)
    assert await client.cancel_job(job_id) == JobInfo(job_id, JobStatus.CANCELED)


async def test_a_running_jobs_call_is_cancelled_in_the_replica(
    replica: None,
    client: AsyncClient,
    http: httpx.AsyncClient,
    processes: Processes,
    connection: redis.Redis,
    settings: Settings,
) -> None:
    job_worker(processes)
    job_id = await client.submit_job("rec", {"id": "held", "hold": True})
    await wait_for_event("held", "start")
    assert (await status_of(http, job_id))["status"] == "started"
    answer = await http.delete(f"/-/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"job_id": job_id, "status": "canceled"}
    # The handler's task got CancelledError: its except/finally ran.
    await wait_for_event("held", "cancelled", CANCEL_REACHES_HANDLER_S)
    assert events_of("held") == ["start", "cancelled"]
    assert await status_of(http, job_id) == {"job_id": job_id, "status": "canceled"}
    assert not counted(connection, settings, job_id)
    # The job function failed the job as cancelled, and its worker takes the next job.
    after = await client.submit_job("rec", {"id": "after"})
    await wait_for_job(http, after, "finished", processes)
    assert recorded_error(connection, job_id)["error"] == "RequestCancelledError"
    assert await status_of(http, job_id) == {"job_id": job_id, "status": "canceled"}
    # A cancel is no error of the worker's: one line, no traceback.
    log = processes.log("job-worker").read_text()
    assert f"job {job_id} cancelled" in log and "Traceback" not in log, log


async def test_a_result_that_comes_after_the_cancel_is_dropped(
    replica: None,
    client: AsyncClient,
    http: httpx.AsyncClient,
    connection: redis.Redis,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The call ends after DELETE answered, before the job function looked again: the job still ends canceled."""
    monkeypatch.setattr(job_function, "JOB_CANCEL_POLL_S", 3600.0)  # it never looks while the call runs
    job_function.configure(settings)
    queue = rq_queue(connection, settings)
    job_id = await client.submit_job("rec", {"id": "late", "hold": True})
    worker = asyncio.create_task(
        asyncio.to_thread(ThreadWorker([queue], connection=connection, serializer=JOB_SERIALIZER).work, burst=True)
    )
    try:
        await wait_for_event("late", "start")
        assert (await http.delete(f"/-/jobs/{job_id}")).status_code == 200
        cancel_job_deployments.RELEASE.set()  # the call returns its result
        await asyncio.wait_for(worker, 30)
    finally:
        cancel_job_deployments.RELEASE.set()
        await asyncio.wait_for(worker, 30)
        job_function.close()
    assert events_of("late") == ["start", "done"]
    assert await status_of(http, job_id) == {"job_id": job_id, "status": "canceled"}
    assert recorded_error(connection, job_id)["error"] == "RequestCancelledError"


async def test_cancelling_a_job_that_has_ended_is_409_naming_its_status(
    replica: None, client: AsyncClient, http: httpx.AsyncClient, processes: Processes
) -> None:
    job_worker(processes)
    finished = await client.submit_job("rec", {"id": "finished"})
    failed = await client.submit_job("rec", {"id": "failed", "fail": True})
    await wait_for_job(http, finished, "finished", processes)
    await wait_for_job(http, failed, "failed", processes)
    canceled = await client.submit_job("rec", {"id": "canceled", "hold": True})
    await wait_for_event("canceled", "start")
    assert (await http.delete(f"/-/jobs/{canceled}")).status_code == 200
    for job_id, status in ((finished, "finished"), (failed, "failed"), (canceled, "canceled")):
        answer = await http.delete(f"/-/jobs/{job_id}")
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "ConflictError" and f"it is {status}" in answer.json()["message"]
    # The refused cancel lost nothing: the finished job keeps its result.
    assert await status_of(http, finished) == {"job_id": finished, "status": "finished", "result": {"id": "finished"}}
    assert (await status_of(http, failed))["error"] == {"error": "ValueError", "message": "failed on purpose: failed"}


async def test_a_cancel_that_loses_the_race_with_the_calls_end_is_409(
    replica: None, client: AsyncClient, http: httpx.AsyncClient, connection: redis.Redis, settings: Settings
) -> None:
    """The job function recorded the end of its call (RQ has not written it yet): the cancel is too late."""
    job_id = await client.submit_job("rec", {"id": "raced"})
    job = Job.fetch(job_id, connection=connection, serializer=JOB_SERIALIZER)
    assert settle(job, settings.keys, JobStatus.FINISHED, settings.job_result_ttl_s)
    answer = await http.delete(f"/-/jobs/{job_id}")
    assert answer.status_code == 409 and "it is finished" in answer.json()["message"], answer.text
    assert counted(connection, settings, job_id)  # still counted: its job function uncounts it as it ends


async def test_a_job_that_rq_ended_by_itself_is_409(
    replica: None, client: AsyncClient, http: httpx.AsyncClient, connection: redis.Redis
) -> None:
    """Failed by RQ, not by its job function (its time limit, its worker gone): the cancel is too late."""
    job_id = await client.submit_job("rec", {"id": "rq-failed"})
    Job.fetch(job_id, connection=connection, serializer=JOB_SERIALIZER).set_status(RQJobStatus.FAILED)
    answer = await http.delete(f"/-/jobs/{job_id}")
    assert answer.status_code == 409 and "it is failed" in answer.json()["message"], answer.text
    assert (await status_of(http, job_id))["status"] == "failed"


@pytest.mark.parametrize("job_id", ["no-such-job", "0d5c9559-df67-4077-b372-2a4721aa3e15", "bad.id", "x" * 200])
async def test_cancelling_an_unknown_job_is_404(http: httpx.AsyncClient, job_id: str) -> None:
    answer = await http.delete(f"/-/jobs/{job_id}")
    assert answer.status_code == 404 and answer.json()["error"] == "NotFoundError", answer.text


async def test_cancelling_a_job_is_an_admin_write(replica: None, client: AsyncClient, settings: Settings) -> None:
    token = "job-cancel-token"
    job_id = await client.submit_job("rec", {"id": "guarded"})
    async with gateway(settings, api_key=SecretStr(token)) as http:
        refused = [
            await http.delete(f"/-/jobs/{job_id}"),
            await http.delete(f"/-/jobs/{job_id}", headers={"Authorization": "Bearer wrong"}),
            await http.delete(
                f"/-/jobs/{job_id}", headers={"Authorization": f"Bearer {token}", "Origin": "http://evil.example"}
            ),
        ]
        assert [answer.status_code for answer in refused] == [401, 401, 403], [answer.text for answer in refused]
        assert (await http.get(f"/-/jobs/{job_id}")).json()["status"] == "queued"  # nothing was cancelled
        allowed = await http.delete(f"/-/jobs/{job_id}", headers={"X-API-Key": token})
        assert allowed.status_code == 200 and allowed.json()["status"] == "canceled", allowed.text
    async with gateway(settings) as http:  # a gateway without a token takes no admin write
        assert (await http.delete(f"/-/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})).status_code == 403


async def test_a_tenants_api_key_cancels_the_jobs_sent_for_its_tenant_only(
    replica: None, client: AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    keys = tmp_path / "tenant-keys"
    acme, globex = "acme-" + "k" * 27, "globex-" + "k" * 25
    keys.write_text(f"{acme} acme\n{globex} globex\n")
    own = await client.submit_job("rec", {"id": "acme's"}, tenant="acme")
    others = await client.submit_job("rec", {"id": "globex's"}, tenant="globex")
    untold = await client.submit_job("rec", {"id": "the default tenant's"})
    async with gateway(settings, api_key=SecretStr("admin-token"), tenant_keys=str(keys)) as http:
        as_acme = {"Authorization": f"Bearer {acme}"}
        refused = [await http.delete(f"/-/jobs/{job}", headers=as_acme) for job in (others, untold)]
        assert [answer.status_code for answer in refused] == [403, 403], [answer.text for answer in refused]
        assert "was sent for another tenant" in refused[0].json()["message"]
        unknown_key = await http.delete(f"/-/jobs/{own}", headers={"Authorization": "Bearer " + "x" * 32})
        assert unknown_key.status_code == 401 and "a tenant's API key" in unknown_key.json()["message"]
        as_admin = {"Authorization": "Bearer admin-token"}
        statuses = [
            (await http.get(f"/-/jobs/{job}", headers=as_admin)).json()["status"] for job in (own, others, untold)
        ]
        assert statuses == ["queued"] * 3
        # An admin write whichever key it carries: a web page of another site is refused, as for the admin token.
        from_a_page = await http.delete(f"/-/jobs/{own}", headers={**as_acme, "Origin": "http://evil.example"})
        assert from_a_page.status_code == 403 and "Origin" in from_a_page.json()["message"], from_a_page.text
        cancelled = await http.delete(f"/-/jobs/{own}", headers=as_acme)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "canceled", cancelled.text
        # The admin token still cancels any job.
        admin = await http.delete(f"/-/jobs/{others}", headers={"Authorization": "Bearer admin-token"})
        assert admin.status_code == 200 and admin.json()["status"] == "canceled", admin.text
    with pytest.raises(ForbiddenError, match="another tenant"):
        await client.cancel_job(untold, for_tenant="acme")
    assert (await client.cancel_job(untold, for_tenant=DEFAULT_TENANT)).status is JobStatus.CANCELED


async def test_a_tenants_api_key_reads_the_jobs_sent_for_its_tenant_only(
    replica: None, client: AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    """With tenant keys, a job's status and result are its tenant's: anyone holding its id (it is in access logs and
    Location headers) read them before."""
    keys = tmp_path / "tenant-keys"
    acme, globex = "acme-" + "k" * 27, "globex-" + "k" * 25
    keys.write_text(f"{acme} acme\n{globex} globex\n")
    own = await client.submit_job("rec", {"id": "acme's"}, tenant="acme")
    async with gateway(settings, api_key=SecretStr("admin-token"), tenant_keys=str(keys)) as http:
        refused = [
            await http.get(f"/-/jobs/{own}"),
            await http.get(f"/-/jobs/{own}", headers={"Authorization": "Bearer " + "x" * 32}),
            await http.get(f"/-/jobs/{own}", headers={"Authorization": f"Bearer {globex}"}),
        ]
        assert [answer.status_code for answer in refused] == [401, 401, 403], [answer.text for answer in refused]
        assert "tenant that sent them" in refused[0].json()["message"]
        assert "was sent for another tenant" in refused[2].json()["message"]
        readers = (
            {"Authorization": f"Bearer {acme}"},
            {"Authorization": "Bearer admin-token"},
            {"Authorization": f"Bearer {acme}", "X-API-Key": "a-proxy-s-own"},  # (an API gateway may add its own)
        )
        for headers in readers:
            answer = await http.get(f"/-/jobs/{own}", headers=headers)
            assert answer.status_code == 200 and answer.json() == {"job_id": own, "status": "queued"}, answer.text
    async with gateway(settings) as http:  # without tenant keys, the id is all it takes, as before
        assert (await http.get(f"/-/jobs/{own}")).json() == {"job_id": own, "status": "queued"}
    with pytest.raises(ForbiddenError, match="another tenant"):
        await client.job(own, for_tenant="globex")
    assert (await client.job(own, for_tenant="acme")).status is JobStatus.QUEUED


async def test_the_python_clients_cancel_jobs(replica: None, client: AsyncClient, settings: Settings) -> None:
    first = await client.submit_job("rec", {"id": "first"})
    second = await client.submit_job("rec", {"id": "second"})
    assert await client.cancel_job(first) == JobInfo(first, JobStatus.CANCELED)
    with pytest.raises(ConflictError, match="it is canceled"):
        await client.cancel_job(first)
    with pytest.raises(NotFoundError):
        await client.cancel_job("no-such-job")

    def blocking() -> None:
        with Client(settings=settings) as sync:
            assert sync.cancel_job(second) == JobInfo(second, JobStatus.CANCELED)
            assert sync.job(second).status is JobStatus.CANCELED
            with pytest.raises(ConflictError, match="it is canceled"):
                sync.cancel_job(second)
            with pytest.raises(NotFoundError):
                sync.cancel_job("no-such-job")

    await asyncio.to_thread(blocking)


async def test_cancelling_with_the_jobs_redis_away_is_503(settings: Settings) -> None:
    away = settings.model_copy(update={"jobs_redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    async with gateway_http(away) as http:
        answer = await http.delete("/-/jobs/0d5c9559-df67-4077-b372-2a4721aa3e15")
    assert answer.status_code == 503 and answer.json()["error"] == "RedisUnavailableError", answer.text
