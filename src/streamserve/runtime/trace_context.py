"""What a request's trace looks like (docs/tracing.md): its spans' names and attributes, and how a trace context
rides in a stream entry (Request.trace, .trace_state, .sent_ns) from the caller to the replica.

The spans of one call: the gateway's ``POST /route`` (its caller's ``traceparent`` continued), the caller's
``enqueue <deployment>`` (the client's, in the gateway or the user's program), whose context the entry carries;
then on the replica, children of ``enqueue``: ``queue wait`` (from the send to the replica taking it),
``handler`` (the user's code; calls through handles in it are its children) and ``reply`` (until Redis has the
reply and the acknowledgement). A job's ``job <name>`` span links to the call that queued it.

Only the W3C trace context format travels in entries, whatever propagators the processes use over HTTP.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from streamserve.wire.messages import Request

# Span names (the enqueue and job spans add the deployment's name).
ENQUEUE = "enqueue"
QUEUE_WAIT = "queue wait"
HANDLER = "handler"
REPLY = "reply"
JOB = "job"

# Attributes of ours (the OpenTelemetry conventions' own where one fits: messaging.*, http.*).
DEPLOYMENT = "streamserve.deployment"
REQUEST_ID = "streamserve.request_id"
PARENT_REQUEST_ID = "streamserve.parent_request_id"
REPLICA = "streamserve.replica"
METHOD = "streamserve.method"
QUEUE_WAIT_MS = "streamserve.queue_wait_ms"
BATCH_SIZE = "streamserve.batch_size"
CHUNKS = "streamserve.chunks"
FIRST_CHUNK = "streamserve.first_chunk"
OUTCOME = "streamserve.outcome"
SHARED = "streamserve.shared"
JOB_ID = "streamserve.job_id"
ATTEMPTS = "streamserve.attempts"

_W3C = TraceContextTextMapPropagator()


def start_enqueue(tracer: Tracer, request: Request, deployment: str, stream: str) -> Span | None:
    """Start ``request``'s enqueue span (a child of the current span) and write its context into the request, so
    that the replica's spans are its children. None, and only the current context written, when the current trace is
    sampled out: no span of it would be recorded, here or further on."""
    parent_context = trace.get_current_span().get_span_context()
    if parent_context.is_valid and not parent_context.trace_flags.sampled:
        carry(request, None)
        return None
    span = tracer.start_span(
        f"{ENQUEUE} {deployment}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "redis",
            "messaging.operation.type": "send",
            "messaging.destination.name": stream,
            DEPLOYMENT: deployment,
            REQUEST_ID: request.request_id,
        },
    )
    carry(request, trace.set_span_in_context(span))
    return span


def traceparent(span: Span | None) -> str:
    """The W3C traceparent of ``span`` (None: of the current span), "" when there is none. (The format written out:
    the propagator's generic machinery cost a request more than the rest of ``carry``.)"""
    span_context = (span or trace.get_current_span()).get_span_context()
    if not span_context.is_valid:
        return ""
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"


def link_to(traceparent: str) -> list[Link]:
    """A link to the span ``traceparent`` names (none for "", or for one that is malformed)."""
    if not traceparent:
        return []
    span_context = trace.get_current_span(
        _W3C.extract({"traceparent": traceparent}, context=Context())
    ).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


def failed(span: Span, exc: BaseException) -> None:
    """Mark ``span`` with the error that ended what it measured."""
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


@contextlib.contextmanager
def ending(span: Span | None) -> Iterator[None]:
    """End ``span`` (None: there is none) when the block ends, marked with the error that ended it, if one did. (Not
    on the hot path: a generator's context manager costs a call about a microsecond even without a span.)"""
    if span is None:
        yield
        return
    try:
        yield
    except BaseException as exc:
        failed(span, exc)
        raise
    finally:
        span.end()


def cancelled(span: Span) -> None:
    """Mark ``span`` as cancelled: what it measured was stopped because nobody wanted it any more."""
    span.set_attribute(OUTCOME, "cancelled")
    span.set_status(Status(StatusCode.ERROR, "cancelled"))


def carry(request: Request, ctx: Context | None) -> None:
    """Write trace context ``ctx`` (None: the current one) into ``request`` (nothing when it has no span)."""
    span = trace.get_current_span(ctx)
    span_context = span.get_span_context()
    if not span_context.is_valid:
        return
    request.trace = traceparent(span)
    request.trace_state = span_context.trace_state.to_header() if span_context.trace_state else ""
    request.sent_ns = time.time_ns()


def sampled(traceparent: str) -> bool:
    """Whether a W3C traceparent's flags say its trace is sampled (recorded)."""
    try:
        return bool(int(traceparent[-2:], 16) & 1)
    except ValueError:
        return True  # malformed: extracting it gives a new trace, which the sampler decides on


def parent_of(request: Request) -> Context:
    """The trace context a request's entry carries (an empty one, for a new trace, when it carries none)."""
    if not request.trace:
        return Context()
    carrier = {"traceparent": request.trace}
    if request.trace_state:
        carrier["tracestate"] = request.trace_state
    return _W3C.extract(carrier, context=Context())


def chunks_sent(ctx: Context, first: int, count: int) -> None:
    """A stream's chunks ``first`` to ``first + count - 1`` reached Redis: one event on its handler span (whose
    context is ``ctx``), not a span per chunk. (A span keeps OTEL_SPAN_EVENT_COUNT_LIMIT events, 128 by default;
    the stream's total is its ``streamserve.chunks``.)"""
    trace.get_current_span(ctx).add_event("chunks", {CHUNKS: count, FIRST_CHUNK: first})


def log_ids(request: Request) -> dict[str, str]:
    """The ``trace_id`` a log line about ``request`` carries (as ``extra``), when it is traced."""
    return {"trace_id": request.trace[3:35]} if request.trace else {}  # traceparent: 00-<trace id>-<span id>-<flags>


def attach(ctx: Context) -> object:
    """Make ``ctx`` current (on this thread, or in this task); the token that ``detach`` takes."""
    return otel_context.attach(ctx)


def detach(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]
