"""Asynchronous jobs from the caller's side: queue a call to run later, read back its status and result.

The RQ queue itself is ``jobs.JobQueue``; it is blocking, so these methods run
it in a worker thread, on the core's own small blocking connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from opentelemetry.trace import SpanKind

from streamserve.client.calls import call_timeout_s, encode_body
from streamserve.client.core import ClientCore
from streamserve.client.jobs import JobInfo
from streamserve.runtime import trace_context
from streamserve.wire.idempotency import check_key
from streamserve.wire.messages import method_of
from streamserve.wire.models import model_id_of
from streamserve.wire.priorities import parse_priority
from streamserve.wire.tenants import tenant_of

T = TypeVar("T")


class JobCalls(ClientCore):
    """Calls queued as RQ jobs: checked now like ``call``, run later by a job worker."""

    async def submit_job(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        method: str = "",
        idempotency_key: str | None = None,
        priority: str | None = None,
        tenant: str | None = None,
        model_id: str | None = None,
    ) -> str:
        """Queue a call of ``name`` as an asynchronous job; return the job id (see ``job``).

        The body is checked now (JSON, size, the name exists and can be
        served), the call runs later on a job worker, through the same request
        stream and replicas as ``call``. ``timeout`` bounds the call once it
        starts (default: the deployment's ``request_timeout_s``).
        OverloadedError when the deployment has ``max_queued_jobs`` jobs that
        have not ended (for an endpoint: the deployment it picks now).
        ``idempotency_key``: a call with a key that queued a job already (for
        ``name``, the same method and body) gets that job's id, and queues
        nothing (for the deployment's ``idempotency_ttl_s``). ``priority``: the level its call is queued at;
        ``tenant``: whom it is for (its call counts against that tenant's limits when it runs); ``model_id``: the model
        its call runs with (docs/multiplexing.md).
        """
        if idempotency_key is not None:
            check_key(idempotency_key)
        level = parse_priority(priority)
        whom = tenant_of(tenant)
        model = model_id_of(model_id)
        method = method_of(method)
        encoded = encode_body(body)
        self._check_size(encoded)
        route = await self.route(name)
        timeout_s = call_timeout_s(timeout, route.deployment)
        # RQ serialises with the standard json module: hand it what orjson made of the body, plain JSON types.
        plain = orjson.loads(encoded)
        jobs = self._job_queue()
        span = None
        if self._tracer is not None:  # the job's run links to this span
            attributes = {trace_context.DEPLOYMENT: route.deployment.name}
            span = self._tracer.start_span(
                f"{trace_context.ENQUEUE} job {name}", kind=SpanKind.PRODUCER, attributes=attributes
            )
        with trace_context.ending(span):
            traceparent = trace_context.traceparent(span)
            job_id = await self._in_thread(
                lambda: jobs.enqueue(
                    name,
                    plain,
                    counted_in=route.deployment,
                    method=method,
                    timeout=timeout,
                    call_timeout_s=timeout_s,
                    idempotency_key=idempotency_key,
                    priority=level,
                    tenant=whom,
                    model=model,
                    trace=traceparent,
                )
            )
            if span is not None:
                span.set_attribute(trace_context.JOB_ID, job_id)
        return job_id

    async def job(self, job_id: str, *, for_tenant: str | None = None) -> JobInfo:
        """A job's status, with its result once finished or its error once failed; NotFoundError after its TTL.
        ``for_tenant``: read it only if it was sent for this tenant (ForbiddenError otherwise), as the gateway does
        for a tenant's API key."""
        jobs = self._job_queue()
        return await self._in_thread(lambda: jobs.info(job_id, for_tenant))

    async def cancel_job(self, job_id: str, *, for_tenant: str | None = None) -> JobInfo:
        """Cancel a job: queued, it never runs; running, its call is cancelled (as when a caller stops waiting).

        Returns the job, now ``canceled``. ConflictError, naming its status, when it has ended already (finished,
        failed or canceled); NotFoundError as for ``job``. ``for_tenant``: cancel it only if it was sent for this
        tenant (ForbiddenError otherwise), as the gateway does for a tenant's API key.
        """
        jobs = self._job_queue()
        return await self._in_thread(lambda: jobs.cancel(job_id, for_tenant))

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        with self._job_refusals:
            return await asyncio.to_thread(fn)
