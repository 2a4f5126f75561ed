"""Asynchronous jobs: enqueue a call on the RQ queue and read back its status, result or error.

RQ keeps each job's status, result and TTL; an RQ worker (``streamserve
job-worker``, kept running by the scheduler) runs ``JOB_FUNCTION``, which makes
an ordinary call through the deployment's request stream. Everything RQ writes
is serialised as JSON (``JSONSerializer``), never pickled: a job is a
deployment name, a JSON body and two plain options, and a job worker runs
nothing else (``job_guard.GuardedJob``, whoever wrote the job).

Each deployment accepts at most ``max_queued_jobs`` jobs that have not ended:
a job is counted in the deployment's accepted-jobs set (one Lua script checks
the bound and counts it) before RQ queues it, and uncounted when its call
ends (``uncount``), when its worker is found dead, or, for whatever ended
without saying so, by the job pool's sweep (``prune_counts``).

A job is cancelled (``JobQueue.cancel``) through one key of ours,
``Keys.job_cancel``: a queued job is taken off RQ's queue, and the job
function (workers/job_function.py), which looks at the key before its call
and often while it waits, cancels a running call. The cancel and the end of
the call race to set that key (SET NX, ``settle``), so exactly one of them
wins: a job cancelled first reads ``canceled`` for good (a result that came
later is dropped), one that ended first keeps its result or error, and its
cancel is a conflict.

This module is blocking (RQ is); the asyncio client calls it in a thread.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RQJobStatus
from rq.registry import CanceledJobRegistry
from rq.serializers import JSONSerializer

from streamserve.client.job_guard import JOB_FUNCTION as JOB_FUNCTION  # what RQ workers run, named here too
from streamserve.client.job_guard import GuardedJob
from streamserve.runtime.processes import is_running, process_ref
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import is_cluster, redacted
from streamserve.wire import scripts
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import (
    BadRequestError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    IdempotencyKeyMismatchError,
    NotFoundError,
    OverloadedError,
    ProtocolError,
    RequestCancelledError,
    shown,
)
from streamserve.wire.idempotency import request_digest
from streamserve.wire.keys import Keys
from streamserve.wire.messages import now_ms, text
from streamserve.wire.priorities import Priority
from streamserve.wire.states import ENDED_JOB_STATUSES, JobStatus
from streamserve.wire.tenants import DEFAULT_TENANT

# The serializer of every job, on both sides: the queue here and the workers' (``rq worker -S``).
JOB_SERIALIZER = JSONSerializer

# RQ's hard limit on a job is the call's own timeout plus this: the call normally ends first, with its own error.
JOB_TIMEOUT_MARGIN_S = 30

# The job-meta field where the job function leaves ``{"error", "message"}`` before it fails the job.
ERROR_META = "error"

# The job-meta field naming the deployment whose ``max_queued_jobs`` counts the job (the one picked when it was queued).
COUNTED_IN_META = "counted_in"

# The job-meta field with the W3C traceparent of the call that queued the job, when that call was traced: the job's
# run links to it (runtime/trace_context.py).
TRACE_META = "trace"

# A count this old whose job has ended, or is gone, is dropped by the sweep: the time between counting a job and RQ
# queueing it, with plenty to spare.
PRUNE_AFTER_MS = 60_000

# How long a job may sit taken by a worker and not started before it counts as stranded by that worker's death (a live
# worker starts what it takes within milliseconds; requeue_stranded).
STRANDED_AFTER_S = 5.0

# RQ's statuses of a job that has ended.
_ENDED = {RQJobStatus.FINISHED.value, RQJobStatus.FAILED.value, RQJobStatus.STOPPED.value, RQJobStatus.CANCELED.value}

# The error of a job whose worker stopped while running it (killed, or died with its machine).
ABANDONED_ERROR = "JobAbandoned"

# How the job workers that ``streamserve job-worker`` runs are named: ``streamserve-jobs.HOST.PID.START``.
JOB_WORKER_PREFIX = "streamserve-jobs."

_JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")

# RQ's statuses, folded into the five a caller needs to tell apart.
_STATUS_OF: dict[str, JobStatus] = {
    RQJobStatus.CREATED: JobStatus.QUEUED,
    RQJobStatus.QUEUED: JobStatus.QUEUED,
    RQJobStatus.DEFERRED: JobStatus.QUEUED,
    RQJobStatus.SCHEDULED: JobStatus.QUEUED,
    RQJobStatus.RATE_LIMITED: JobStatus.QUEUED,
    RQJobStatus.READY_TO_ENQUEUE: JobStatus.QUEUED,
    RQJobStatus.STARTED: JobStatus.STARTED,
    RQJobStatus.FINISHED: JobStatus.FINISHED,
    RQJobStatus.FAILED: JobStatus.FAILED,
    RQJobStatus.STOPPED: JobStatus.FAILED,
    RQJobStatus.CANCELED: JobStatus.CANCELED,
}


@dataclass(frozen=True)
class JobInfo:
    """What ``GET /-/jobs/<id>`` and ``client.job(id)`` answer."""

    job_id: str
    status: JobStatus
    # The deployment's JSON result, once FINISHED.
    result: Any = None
    # ``{"error": type, "message": ...}`` once FAILED.
    error: dict[str, str] | None = field(default=None)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": self.job_id, "status": self.status.value}
        if self.status is JobStatus.FINISHED:
            body["result"] = self.result
        if self.error is not None:
            body["error"] = self.error
        return body

    def encoded(self) -> bytes:
        """``to_json()`` as JSON, the result encoded on its own: one as deeply nested as a result may be
        (json_values.MAX_DEPTH) is a level too deep for orjson inside the object around it."""
        if self.status is not JobStatus.FINISHED:
            return orjson.dumps(self.to_json())
        head = orjson.dumps({"job_id": self.job_id, "status": self.status.value})
        return head[:-1] + b',"result":' + orjson.dumps(self.result) + b"}"


def jobs_redis_url(settings: Settings) -> str:
    """The Redis RQ keeps jobs in: ``STREAMSERVE_JOBS_REDIS_URL``, else the farm's.

    ConfigError, naming the fix, when that is a Redis Cluster: one RQ call touches keys of many job ids, which a
    cluster refuses (CROSSSLOT). Processes that run jobs ask at start, so that the refusal comes then.
    """
    url = settings.effective_jobs_redis_url
    if not is_cluster(url):
        return url
    if settings.jobs_redis_url:
        raise ConfigError(
            f"STREAMSERVE_JOBS_REDIS_URL ({redacted(url)}) is a Redis Cluster; asynchronous jobs need a single "
            "Redis server there (RQ's keys span cluster slots)"
        )
    # (STREAMSERVE_JOB_WORKERS=0 set already is a farm run without jobs on purpose: only the other fix is named)
    without = "" if settings.job_workers == 0 else ", or STREAMSERVE_JOB_WORKERS=0 to run without asynchronous jobs"
    raise ConfigError(
        f"the farm's Redis ({redacted(url)}) is a Redis Cluster, where asynchronous jobs cannot live (RQ's keys "
        "span cluster slots): set STREAMSERVE_JOBS_REDIS_URL to a single Redis server for them (e.g. "
        f"redis://jobs-redis:6379/0){without}"
    )


# How long a call that claimed a job idempotency key has to queue its job: until then, a retry that finds no job
# takes it to be on its way (the retry policy's own attempts take seconds at most).
CLAIM_QUEUEING_MS = 60_000


def _claim_record(claim: str, raw: bytes | str) -> tuple[str, str, int]:
    """A job idempotency record (Keys.job_idempotency) as (job id, digest, when it was claimed: epoch ms; 0 for a
    record written before it said)."""
    try:
        earlier_id, digest, *claimed = orjson.loads(raw)
        return str(earlier_id), str(digest), int(claimed[0]) if claimed else 0
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"malformed job idempotency record {claim}: {exc}") from exc


class JobQueue:
    """The RQ queue of one key prefix, with JSON serialisation and our TTL."""

    def __init__(self, connection: redis.Redis, keys: Keys, result_ttl_s: int) -> None:
        self.connection = connection
        self._keys = keys
        self._result_ttl_s = result_ttl_s
        # GuardedJob: what RQ does with a job here (its registries' cleanup, which may fail it) calls no callback.
        self.queue = Queue(keys.jobs_queue(), connection=connection, serializer=JOB_SERIALIZER, job_class=GuardedJob)
        self._admit = connection.register_script(scripts.ADMIT_JOB)
        self._requeue = connection.register_script(scripts.REQUEUE_STRANDED_JOB)
        self._delete_if_value = connection.register_script(scripts.DELETE_IF_VALUE)
        self._stranded_since: dict[str, float] = {}  # job id -> when requeue_stranded first saw it taken, not started

    def enqueue(
        self,
        name: str,
        body: Any,
        *,
        counted_in: DeploymentConfig,
        method: str = "",
        timeout: float | None,
        call_timeout_s: float,
        idempotency_key: str | None = None,
        priority: Priority = Priority.NORMAL,
        tenant: str = DEFAULT_TENANT,
        model: str = "",
        trace: str = "",
    ) -> str:
        """Queue a call of deployment or endpoint ``name`` (at ``priority``, for ``tenant``, with ``model``); return the
        job id.

        ``idempotency_key``: the job that an earlier call with this key queued (for ``name``, the same method and
        body), if any, instead of a new one; IdempotencyKeyMismatchError for the key with another method, model or body.

        The job counts against ``counted_in``'s ``max_queued_jobs`` (the
        deployment that ``name`` routes to now): OverloadedError, with nothing
        queued, when that deployment has as many jobs not ended yet.
        ``timeout`` is passed to the call (None: the deployment's
        ``request_timeout_s``); ``call_timeout_s`` is how long that call may
        take at most, which bounds the job's run time. ``trace``: the traceparent of the span that queued it, "" for
        none.
        """
        job_id = str(uuid.uuid4())
        claim = ""
        if idempotency_key is not None:
            claim = self._keys.job_idempotency(name, idempotency_key, tenant)
            digest = request_digest(method, orjson.dumps(body), model)
            earlier = self._claim(claim, idempotency_key, job_id, digest, counted_in.idempotency_ttl_s)
            if earlier is not None:
                return earlier
        try:
            terms = (priority, tenant, model, trace)
            self._enqueue(name, body, counted_in, method, timeout, call_timeout_s, job_id, terms)
        except BaseException:
            if claim:
                with contextlib.suppress(redis.RedisError):
                    self.connection.delete(claim)  # nothing was queued: a retry with the key queues the job
            raise
        return job_id

    def _claim(self, claim: str, key: str, job_id: str, digest: str, ttl_s: float) -> str | None:
        """Take idempotency key ``key`` (its record ``claim``) for job ``job_id``: None when it is ours now, else the
        job id it named already. A key whose job is gone (its result's TTL, shorter than the key's, passed) is taken
        anew: there is no job to name, and a retry that was told "queued" would wait for one that never comes."""
        mine = orjson.dumps([job_id, digest, now_ms()])
        while True:
            if self.connection.set(claim, mine, nx=True, px=int(ttl_s * 1000)):
                return None
            raw = self.connection.get(claim)
            if raw is None:  # it expired (or its job could not be queued) just now
                continue
            earlier_id, earlier_digest, claimed_ms = _claim_record(claim, raw)
            if self._gone(earlier_id, claimed_ms):  # (whatever its body was: the key is free, as the docs say)
                self._delete_if_value(keys=[claim], args=[raw])  # unless another retry took it meanwhile
                continue
            if earlier_digest != digest:
                raise IdempotencyKeyMismatchError(
                    f"idempotency key {key!r} queued a job before with another method, model or body: "
                    "a retry must repeat its request exactly, and a new request needs a new key"
                )
            return earlier_id

    def _gone(self, job_id: str, claimed_ms: int) -> bool:
        """Whether job ``job_id``, named by a key claimed at ``claimed_ms``, no longer exists (not: it is being queued
        by the call that claimed the key, which has CLAIM_QUEUEING_MS to do so, or less under a shorter result TTL:
        a job may have run and lapsed within the minute)."""
        queueing_ms = min(CLAIM_QUEUEING_MS, self._result_ttl_s * 1000)
        return now_ms() - claimed_ms > queueing_ms and not self.connection.exists(Job.key_for(job_id))

    def _enqueue(
        self,
        name: str,
        body: Any,
        counted_in: DeploymentConfig,
        method: str,
        timeout: float | None,
        call_timeout_s: float,
        job_id: str,
        terms: tuple[Priority, str, str, str],
    ) -> None:
        """``terms``: the call's priority, tenant and model, and the traceparent that queued it ("": none)."""
        priority, tenant, model, trace = terms
        if not self._admit(
            keys=[self._keys.accepted_jobs(counted_in.name)], args=[counted_in.max_queued_jobs, job_id, now_ms()]
        ):
            raise OverloadedError(
                f"deployment {counted_in.name!r} has {counted_in.max_queued_jobs} "
                f"job{'s' if counted_in.max_queued_jobs != 1 else ''} queued or running "
                "(max_queued_jobs)"
            )
        try:
            self.queue.enqueue_call(
                JOB_FUNCTION,
                # (job_function.run's arguments; job_tenant reads the tenant back)
                args=(name, body, method, timeout, priority.value, tenant, *((model,) if model else ())),
                timeout=int(call_timeout_s) + JOB_TIMEOUT_MARGIN_S,
                result_ttl=self._result_ttl_s,
                failure_ttl=self._result_ttl_s,
                # RQ's default description is the call's repr, body included: keep a large body out of it.
                description=f"streamserve call {name}" + (f".{method}" if method else ""),
                job_id=job_id,
                meta={COUNTED_IN_META: counted_in.name, **({TRACE_META: trace} if trace else {})},
            )
        except BaseException:
            with contextlib.suppress(redis.RedisError):
                self.connection.zrem(self._keys.accepted_jobs(counted_in.name), job_id)
            raise

    def info(self, job_id: str, for_tenant: str | None = None) -> JobInfo:
        """The job's status, and its result or error once it has one; NotFoundError once it expired (or never was);
        ForbiddenError when ``for_tenant`` is given and the job was sent for another tenant."""
        job = self._fetch(job_id)
        if for_tenant is not None and job_tenant(job) != for_tenant:
            raise ForbiddenError(
                f"job {job_id} was sent for another tenant: a tenant's key reads only the jobs sent with it"
            )
        raw = job.get_status(refresh=False)
        status = self._status_of(job)
        try:
            if status is JobStatus.FINISHED:
                return JobInfo(job_id, status, result=job.return_value())
            if status is JobStatus.FAILED:
                return JobInfo(job_id, status, error=self._error_of(job, raw))
        except ValueError as exc:  # JSON that does not decode: not written by us
            raise ProtocolError(f"job {job_id}: unreadable result: {exc}") from exc
        return JobInfo(job_id, status)

    def cancel(self, job_id: str, for_tenant: str | None = None) -> JobInfo:
        """Cancel the job: queued, it never runs; running, its job function cancels its call. NotFoundError as for
        ``info``; ConflictError, naming its status, once it has ended (cancelled already, or its call ended first);
        ForbiddenError when ``for_tenant`` is given and the job was sent for another tenant.

        Afterwards the job reads ``canceled`` (see the module's docstring for the race with the call's end) and no
        longer counts against its deployment's ``max_queued_jobs``.
        """
        job = self._fetch(job_id)
        if for_tenant is not None and job_tenant(job) != for_tenant:
            raise ForbiddenError(
                f"job {job_id} was sent for another tenant: a tenant's key cancels only the jobs sent with it"
            )
        status = self._status_of(job)
        if status in ENDED_JOB_STATUSES:
            raise ConflictError(f"job {job_id} has ended: it is {status.value}")
        if not settle(job, self._keys, JobStatus.CANCELED, self._result_ttl_s):
            raise ConflictError(f"job {job_id} has ended: it is {self._settled_as(job_id)}")
        if status is JobStatus.QUEUED:
            # Off the queue. A worker that took it meanwhile finds the key set and fails it without calling. RQ
            # refuses only a job it has cancelled already (by hand, with RQ itself): then it is off the queue too.
            try:
                job.cancel()
            except InvalidJobOperation:
                pass
            except ValueError as exc:  # RQ's own race: a worker took it as RQ looked (it finds the cancel and fails it)
                if "not found in Redis" not in str(exc):
                    raise
            self._lapse_when_finished_would(job)
        uncount(job, self._keys)
        return JobInfo(job_id, JobStatus.CANCELED)

    def _lapse_when_finished_would(self, job: Job) -> None:
        """A job cancelled while queued never runs, so RQ never gives its record a TTL, and keeps its id in the queue's
        canceled registry, which nothing cleans: both stayed for ever, and the job answered ``canceled`` for ever.
        Its record now lapses after the result TTL, as a finished job's does (then 404); its cancel key, which
        outlives it, says ``canceled`` meanwhile."""
        canceled = CanceledJobRegistry(self.queue.name, connection=self.connection, serializer=JOB_SERIALIZER)
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.expire(job.key, self._result_ttl_s)
            pipe.zrem(canceled.key, job.id)
            pipe.execute()

    def _fetch(self, job_id: str) -> Job:
        """Job ``job_id`` of this queue; NotFoundError for a malformed id, one unknown or past its TTL (BadRequestError
        for one that is not a string)."""
        if not isinstance(job_id, str):
            raise BadRequestError(f"a job id is a string, got {shown(job_id)}")
        if not _JOB_ID_RE.match(job_id):
            raise NotFoundError(f"no job {shown(job_id)} (not a job id)")
        try:
            job = GuardedJob.fetch(job_id, connection=self.connection, serializer=JOB_SERIALIZER)
        except NoSuchJobError:
            raise NotFoundError(f"no job {job_id!r} (unknown, or its result TTL passed)") from None
        if job.origin != self.queue.name:
            raise NotFoundError(f"no job {job_id!r} on queue {self.queue.name}")
        return job

    def _status_of(self, job: Job) -> JobStatus:
        """RQ's status of ``job`` as callers see it: ``canceled`` once cancelled, unless RQ has its result."""
        raw = job.get_status(refresh=False)
        status = _STATUS_OF.get(raw, JobStatus.QUEUED) if raw is not None else JobStatus.QUEUED
        if status is not JobStatus.FINISHED and cancel_requested(self.connection, self._keys, job.id):
            return JobStatus.CANCELED
        return status

    def _settled_as(self, job_id: str) -> str:
        """The status that won the race for ``job_id``'s cancel key (for the cancel that lost it)."""
        raw = self.connection.get(self._keys.job_cancel(job_id))
        return text(raw) if isinstance(raw, bytes) else "ended"

    def fail_abandoned(self, is_gone: Callable[[str], bool]) -> list[str]:
        """Fail, at once, every started job whose worker ``is_gone`` says has stopped; the ids of those jobs.

        RQ itself fails such a job only once its execution expires (its timeout
        plus a minute) and some worker's maintenance runs; we expire its
        execution now, and let RQ's own cleanup fail it (AbandonedJobError,
        failure callbacks and all), with our message in the job's meta.
        """
        registry = self.queue.started_job_registry
        failed = []
        for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False):
            try:
                job = GuardedJob.fetch(job_id, connection=self.connection, serializer=JOB_SERIALIZER)
            except NoSuchJobError:
                continue
            worker = job.worker_name
            if job.get_status(refresh=False) != RQJobStatus.STARTED or not worker or not is_gone(worker):
                continue
            job.meta[ERROR_META] = {
                "error": ABANDONED_ERROR,
                "message": (
                    f"its job worker {worker} stopped while running it; the call may or may not have run, and one "
                    "still queued may run yet (its result dropped): submit the job again only if it may run twice"
                ),
            }
            job.save_meta()  # type: ignore[no-untyped-call]  # (rq leaves it unannotated)
            self.connection.zadd(registry.key, {f"{job_id}:{execution_id}": 0}, xx=True)
            uncount(job, self._keys)
            failed.append(job_id)
        if failed:
            registry.cleanup(timestamp=0)  # only the executions expired above: scored 0
        return failed

    def requeue_stranded(self) -> tuple[list[str], bool]:
        """Queue again, at the front, the jobs whose worker died after taking them and before starting them; returns
        their ids, and whether some taken job is not started yet (call again STRANDED_AFTER_S later to settle it).

        RQ moves the id of a job a worker takes to the queue's intermediate list, and from there to the started
        registry as it starts it: a live worker does both within milliseconds. A job still in that list, not
        started, STRANDED_AFTER_S after an earlier call first saw it there, was taken by a worker killed in between
        (kill -9). It never ran, so it is queued again rather than left "queued" in no queue until RQ's own cleanup
        fails it (a minute after a worker's maintenance first sees it, and that runs every ten minutes).
        """
        key = self.queue.intermediate_queue_key
        taken = [text(raw) for raw in self.connection.lrange(key, 0, -1)]
        registry = self.queue.started_job_registry
        started = {job_id for job_id, _ in registry.get_job_and_execution_ids(cleanup=False)}
        now = time.monotonic()
        waiting = {job_id: self._stranded_since.get(job_id, now) for job_id in taken if job_id not in started}
        requeued = []
        for job_id, since in waiting.items():
            if now - since >= STRANDED_AFTER_S and self._requeue(keys=[key, self.queue.key], args=[job_id]):
                requeued.append(job_id)
        self._stranded_since = {job_id: since for job_id, since in waiting.items() if job_id not in requeued}
        return requeued, bool(self._stranded_since)

    def prune_counts(self) -> int:
        """Uncount the jobs that ended without saying so, or are gone; how many.

        A job is uncounted by its own call when that ends, and by
        ``fail_abandoned``; this catches the rest: a worker on another host
        that died, RQ's own cleanup, a job deleted by hand. Only counts older
        than PRUNE_AFTER_MS are looked at: a younger one may be counted and not
        queued yet.
        """
        pruned = 0
        older = now_ms() - PRUNE_AFTER_MS
        for key in self.connection.scan_iter(match=self._keys.accepted_jobs_pattern(), count=500):
            counted: list[bytes] = self.connection.zrangebyscore(key, "-inf", older)  # type: ignore[assignment]
            job_ids = [text(job_id) for job_id in counted]
            if not job_ids:
                continue
            pipe = self.connection.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hget(Job.key_for(job_id), "status")
            statuses = pipe.execute()
            ended = [
                job_id for job_id, raw in zip(job_ids, statuses, strict=True) if raw is None or text(raw) in _ENDED
            ]
            if ended:
                pruned += int(self.connection.zrem(key, *ended))
        return pruned

    @staticmethod
    def _error_of(job: Job, raw: str | None) -> dict[str, str]:
        """The job function's own record of the error; else the last line of RQ's traceback (a timeout, a crash)."""
        recorded = job.meta.get(ERROR_META)
        if isinstance(recorded, dict) and isinstance(recorded.get("error"), str):
            return {"error": recorded["error"], "message": str(recorded.get("message", ""))}
        latest = job.latest_result()
        return error_from_traceback(latest.exc_string if latest is not None else None, f"the job ended {raw}")


def settle(job: Job, keys: Keys, status: JobStatus, ttl_s: int) -> bool:
    """Record how ``job`` ended (``status``), unless its cancel or its end was recorded first; whether this won.

    Both sides call it: the cancel with CANCELED, the job function when its call ends. Set once (SET NX), so that
    the job's status is decided by whichever of the two came first; kept for ``ttl_s`` (the result TTL) plus the
    job's time limit, so that it outlives RQ's record of the job, which is kept for the TTL once the job has ended.
    """
    ttl = ttl_s + int(job.timeout or 0)
    return bool(job.connection.set(keys.job_cancel(job.id), status.value, nx=True, ex=ttl))


def cancel_requested(connection: redis.Redis, keys: Keys, job_id: str) -> bool:
    """Whether job ``job_id`` was cancelled before it ended (the job function looks while its call runs)."""
    return connection.get(keys.job_cancel(job_id)) == JobStatus.CANCELED.value.encode()


def cancelled_error(job_id: str) -> RequestCancelledError:
    """The error a cancelled job fails with (the job function's), recorded in its meta."""
    return RequestCancelledError(f"job {job_id} was cancelled (DELETE /-/jobs/{job_id})")


def job_tenant(job: Job) -> str:
    """The tenant ``job`` was sent for: its call's sixth argument (JobQueue._enqueue), else DEFAULT_TENANT."""
    args = job.args
    tenant = args[5] if len(args) > 5 else DEFAULT_TENANT
    return tenant if isinstance(tenant, str) else DEFAULT_TENANT


def uncount(job: Job, keys: Keys) -> None:
    """Take an ended job off its deployment's count (a job queued by a release without counts has none)."""
    deployment = job.meta.get(COUNTED_IN_META)
    if isinstance(deployment, str):
        job.connection.zrem(keys.accepted_jobs(deployment), job.id)


def job_worker_name(pid: int) -> str:
    """The name of job worker ``pid`` on this host: it says where it runs and which process it is (pids recur)."""
    ref = process_ref(pid) or f"{pid}:0"
    return f"{JOB_WORKER_PREFIX}{socket.gethostname()}.{ref.replace(':', '.')}"


def local_worker_gone(name: str) -> bool:
    """Whether ``name`` is a job worker of this host that no longer runs (False for any other worker: can't tell)."""
    parts = name.removeprefix(JOB_WORKER_PREFIX).rsplit(".", 2)
    if not name.startswith(JOB_WORKER_PREFIX) or len(parts) != 3 or parts[0] != socket.gethostname():
        return False
    return not is_running(f"{parts[1]}:{parts[2]}")


def error_from_traceback(exc_string: str | None, default: str) -> dict[str, str]:
    """``{"error", "message"}`` from the last line of a Python traceback (``pkg.mod.Type: message``)."""
    last_line = (exc_string or "").strip().rsplit("\n", 1)[-1].strip()
    error_type, sep, message = last_line.partition(": ")
    if error_type and " " not in error_type and (sep or error_type == last_line):
        return {"error": error_type.rsplit(".", 1)[-1], "message": message}
    return {"error": "JobFailed", "message": last_line or default}
