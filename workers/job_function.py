"""What an RQ worker runs for each asynchronous job: one ordinary call through the deployment's request stream.

The job takes JSON-able arguments only and returns the deployment's JSON
result, so RQ's JSON serializer can carry both. A failed call fails the job:
before re-raising, the function records the error's type and message in the
job's meta (``streamserve.client.jobs.ERROR_META``), which ``GET /-/jobs/<id>``
shows, instead of making readers parse a traceback. A call that Redis refused
for lack of memory did not run (nothing was written): it is sent again for up
to FULL_REDIS_WAIT_S before the job fails with that refusal; so is a call its
tenant's limits refused (RateLimitedError), after the wait the refusal names.

A cancelled job (``DELETE /-/jobs/<id>``, which sets ``Keys.job_cancel``):
the function looks at that key before it calls, and every JOB_CANCEL_POLL_S
while it waits for the call; once set, it cancels the call (its request is
cancelled in the replica) and fails the job with RequestCancelledError. When
the call ends, the function records how (``jobs.settle``); should the cancel
have come first, the job fails as cancelled, whatever the call answered.

Each worker process shares one Client (one reply stream, one reader) across
its jobs. ``streamserve job-worker`` hands it its settings with
``configure``; a plain ``rq worker`` gets them from the environment on the
first job, like any streamserve process. Only ``streamserve job-worker`` (or
``rq worker --job-class streamserve.client.job_guard.GuardedJob``) refuses
jobs that name another function.

A job names a deployment or an endpoint. With ``STREAMSERVE_IMPORT_ALLOW``
set, a job whose call would reach a deployment importing from outside it
fails at once with the ConfigError a write of that deployment gets: the
worker imports no deployment (replicas do, and refuse such a one), so this
only says why sooner than a replica that never loads would.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any

import redis
from opentelemetry.trace import SpanKind
from rq import get_current_job
from rq.job import Job

from streamserve.client import Client
from streamserve.client.jobs import (
    ERROR_META,
    JOB_TIMEOUT_MARGIN_S,
    TRACE_META,
    cancel_requested,
    cancelled_error,
    settle,
    uncount,
)
from streamserve.runtime import trace_context, tracing
from streamserve.runtime.settings import Settings
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import refuses_writes
from streamserve.wire.errors import (
    OverloadedError,
    RateLimitedError,
    RequestCancelledError,
    StreamServeError,
    error_fields,
)
from streamserve.wire.states import JobStatus
from streamserve.wire.tenants import DEFAULT_TENANT

logger = logging.getLogger(__name__)

# How long a call that Redis refuses for lack of memory is tried again: half the room RQ's time limit on a job leaves
# beyond the call itself.
FULL_REDIS_WAIT_S = JOB_TIMEOUT_MARGIN_S / 2

# How often a job waiting for its call looks whether it was cancelled: one GET each time (job workers are few).
JOB_CANCEL_POLL_S = 0.1

_lock = threading.Lock()
_settings: Settings | None = None
_client: Client | None = None


def configure(settings: Settings) -> None:
    """Use these settings for the calls of this process's jobs (closes a client made with other ones)."""
    global _settings
    close()
    with _lock:
        _settings = settings


def close() -> None:
    """Close this process's client, if a job made one (a worker does so on exit)."""
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None:
        client.close()


def _process_settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = Settings()  # a plain `rq worker`: read the environment, once
        return _settings


def _shared_client() -> Client:
    global _client
    settings = _process_settings()
    with _lock:
        if _client is None:
            _client = Client(settings=settings)
        return _client


def run(
    name: str,
    body: Any,
    method: str = "",
    timeout: float | None = None,
    priority: str = "normal",
    tenant: str = DEFAULT_TENANT,
    model: str = "",
) -> Any:
    """Call deployment or endpoint ``name`` with ``body`` (at ``priority``, for ``tenant``, with ``model``); the
    result, or the job fails with the call's error.

    Once the call has ended, however it ended, the job no longer counts against its deployment's
    ``max_queued_jobs``. A job cancelled before its call ended fails with RequestCancelledError.

    When the job worker traces, the run is a span ``job <name>`` (its call's enqueue span a child), linked to the
    span of the call that queued the job.
    """
    job = get_current_job()
    terms = (priority, tenant, model)
    tracer = tracing.tracer()
    if tracer is None:
        return _run(job, name, body, method, timeout, terms)
    attributes = {trace_context.DEPLOYMENT: name, **({trace_context.JOB_ID: job.id} if job is not None else {})}
    with tracer.start_as_current_span(
        f"{trace_context.JOB} {name}",
        kind=SpanKind.CONSUMER,
        links=trace_context.link_to(str(job.meta.get(TRACE_META, "")) if job is not None else ""),
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            return _run(job, name, body, method, timeout, terms)
        except RequestCancelledError:
            trace_context.cancelled(span)
            raise
        except BaseException as exc:
            trace_context.failed(span, exc)
            raise


def _run(job: Job | None, name: str, body: Any, method: str, timeout: float | None, terms: tuple[str, str, str]) -> Any:
    """``run``'s call; ``terms``: its priority, tenant and model."""
    try:
        try:
            _check_allowed(name)
            if job is not None and _cancel_requested(job):
                raise cancelled_error(job.id)  # cancelled as this worker took it: the call is never made
            result = _call_when_redis_has_room(name, body, method, timeout, terms, job)
        except StreamServeError as exc:
            if not isinstance(exc, RequestCancelledError):
                _settle(job, JobStatus.FAILED)  # its error, unless it came after its cancel
            raise
        _settle(job, JobStatus.FINISHED)  # its result, unless it came after its cancel: then dropped
        return result
    except StreamServeError as exc:
        if job is not None:
            job.meta[ERROR_META] = error_fields(exc)
            job.save_meta()  # type: ignore[no-untyped-call]  # (rq leaves it unannotated)
        raise
    finally:
        if job is not None:
            _uncount(job)


def _check_allowed(name: str) -> None:
    """ConfigError when a deployment that a call of ``name`` may reach imports from outside the allow-list.

    What the client knows of ``name``: the deployment itself, or every deployment of the endpoint (shadows too). A
    name it has not seen yet is left to the call, which looks it up; its replicas check it when they load it.
    """
    allow = _process_settings().import_allow_list
    if not allow.prefixes:
        return
    client = _shared_client()
    endpoint = client.endpoints().get(name)
    deployments = client.deployments()
    for reached in sorted(endpoint.deployments if endpoint is not None else {name}):
        cfg = deployments.get(reached)
        if cfg is not None:
            allow.check(cfg.import_path, cfg.name)


def _call_when_redis_has_room(
    name: str, body: Any, method: str, timeout: float | None, terms: tuple[str, str, str], job: Job | None
) -> Any:
    """``terms``: the call's priority, tenant and model."""
    priority, tenant, model = terms
    client = _shared_client()
    give_up_at = time.monotonic() + FULL_REDIS_WAIT_S
    backoff = Backoff(0.1, 2.0)
    while True:
        try:
            calling = client.submit(
                name, body, timeout=timeout, method=method, priority=priority, tenant=tenant, model_id=model or None
            )
            return _wait(calling, job)
        except RateLimitedError as exc:  # its tenant is over its limits: wait for its turn (a job is not in a hurry)
            left_s = give_up_at - time.monotonic()
            if exc.retry_after_s > left_s:  # its turn comes too late: it fails now, not once the wait is spent
                raise
            time.sleep(exc.retry_after_s)
        except OverloadedError as exc:
            refused_for_memory = exc.__cause__ is not None and refuses_writes(exc.__cause__)
            if not refused_for_memory or time.monotonic() >= give_up_at:
                raise
            time.sleep(backoff.next())


def _wait(call: concurrent.futures.Future[Any], job: Job | None) -> Any:
    """The call's result; should ``job`` be cancelled meanwhile, the call is cancelled: RequestCancelledError."""
    while True:
        try:
            return call.result(timeout=None if job is None else JOB_CANCEL_POLL_S)
        except TimeoutError:
            if call.done():  # the call's own TimeoutError, not the poll's
                raise
        assert job is not None
        if _cancel_requested(job):
            call.cancel()  # cancels its request, wherever it is (client/cancels.py)
            raise cancelled_error(job.id)


def _cancel_requested(job: Job) -> bool:
    try:
        return cancel_requested(job.connection, _process_settings().keys, job.id)
    except redis.RedisError as exc:  # not a cancel: the call goes on, under its own deadline
        logger.debug("job %s: could not look whether it was cancelled: %s", job.id, exc)
        return False


def _settle(job: Job | None, status: JobStatus) -> None:
    """Record that ``job``'s call ended with ``status``; RequestCancelledError when its cancel came first."""
    if job is None:
        return
    settings = _process_settings()
    try:
        won = settle(job, settings.keys, status, settings.job_result_ttl_s)
    except redis.RedisError as exc:  # RQ records the end as it can; a cancel racing it now may read canceled
        logger.warning("job %s: could not record that its call ended: %s", job.id, exc)
        return
    if not won:
        raise cancelled_error(job.id) from None


def _uncount(job: Job) -> None:
    settings = _settings  # set by the call (_shared_client); if even that failed, the job pool's sweep uncounts it
    try:
        if settings is not None:
            uncount(job, settings.keys)
    except redis.RedisError as exc:  # the sweep again
        logger.warning("job %s: could not uncount it from its deployment's max_queued_jobs: %s", job.id, exc)
