"""The spans of the requests a replica serves, when it traces (runtime/trace_context.py says what they are).

For each request it takes: ``queue wait`` (from its send, as the entry says, to now), then ``handler``, current
while the handler runs (RequestScope.trace), ended with the request's outcome, and ``reply``, from the handler's
end until Redis has the reply and the acknowledgement. All three are children of the caller's enqueue span; a
request sent by a caller that does not trace starts a trace here, its handler span the root, and its trace context
is written into the Request then (the other spans, and log lines, take it from there).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from streamserve.runtime import trace_context as tc
from streamserve.runtime.request_scope import RequestScope
from streamserve.wire.messages import Reply, ReplyStatus, Request

# How a reply's status marks the handler span, besides OK (and END: a stream that ended well).
_FAILED = {
    ReplyStatus.USER_ERROR: "the handler raised",
    ReplyStatus.BAD_REQUEST: "bad request",
    ReplyStatus.DEADLINE_EXCEEDED: "deadline exceeded",
    ReplyStatus.CANCELLED: "cancelled",
}


class RequestSpans:
    """One replica's request spans: started as it takes a request, ended as it finishes it."""

    def __init__(self, tracer: Tracer, deployment: str, replica_id: str) -> None:
        self._tracer = tracer
        self._attributes = {tc.DEPLOYMENT: deployment, tc.REPLICA: replica_id}
        self._replies: dict[bytes, Span] = {}  # reply spans by entry ref, until the entry is acknowledged

    def started(self, ref: bytes, request: Request, scope: RequestScope) -> None:
        """The replica takes ``request`` (entry ``ref``): its queue wait ends, its handler span starts."""
        now = time.time_ns()
        sent = min(request.sent_ns or _entry_time_ns(ref) or now, now)
        attributes: dict[str, str | int] = {**self._attributes, tc.REQUEST_ID: request.request_id}
        if request.parent:
            attributes[tc.PARENT_REQUEST_ID] = request.parent
        if request.attempts:  # a delivery after its replica died (its earlier ones' spans died with it)
            attributes[tc.ATTEMPTS] = request.attempts
        handler_attributes = {**attributes, tc.METHOD: request.method} if request.method else attributes
        parent = tc.parent_of(request)
        if request.trace and not tc.sampled(request.trace):  # its caller's trace records nothing: nor do we
            scope.trace = parent  # (its handles' calls pass the decision on)
            return
        handler = self._tracer.start_span(tc.HANDLER, context=parent, start_time=now, attributes=handler_attributes)
        scope.trace = trace.set_span_in_context(handler, parent)
        if not request.trace:  # its caller does not trace: its trace starts here, and its other spans join it
            tc.carry(request, scope.trace)
            parent = tc.parent_of(request)
        wait = self._tracer.start_span(
            tc.QUEUE_WAIT,
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=sent,
            attributes={**attributes, tc.QUEUE_WAIT_MS: (now - sent) / 1e6, "messaging.operation.type": "receive"},
        )
        wait.end(end_time=now)

    def batched(self, scope: RequestScope) -> Callable[[int], None]:
        """What a batcher calls with the size of the batch the request ran in."""
        span = trace.get_current_span(scope.trace)
        return lambda size: span.set_attribute(tc.BATCH_SIZE, size)

    def streamed(self, scope: RequestScope, chunks: int) -> None:
        """A streaming handler's request ended, well or not (an error, its deadline, its caller gone), after
        ``chunks`` chunks reached Redis: its handler span's ``streamserve.chunks``."""
        trace.get_current_span(scope.trace).set_attribute(tc.CHUNKS, chunks)

    def ended(
        self,
        ref: bytes,
        request: Request,
        scope: RequestScope,
        reply: Reply,
        answered: bool,
        error: BaseException | None = None,
    ) -> None:
        """The handler of entry ``ref`` is done with ``reply`` (``error``: what it raised, if known); ``answered``:
        the reply is sent (its span ends once Redis has it)."""
        span = trace.get_current_span(scope.trace)
        if not span.is_recording():  # sampled out
            return
        status = reply.status
        failed = _FAILED.get(status)
        if failed is not None:
            span.set_attribute(tc.OUTCOME, status.value)
            if error is not None:
                span.record_exception(error)
            elif status is ReplyStatus.USER_ERROR or status is ReplyStatus.BAD_REQUEST:  # (a stream's, say)
                span.add_event(
                    "exception", {"exception.type": reply.error_type, "exception.message": reply.error_message}
                )
            detail = f"{reply.error_type}: {reply.error_message}" if status is ReplyStatus.USER_ERROR else ""
            span.set_status(Status(StatusCode.ERROR, detail or failed))
        end = time.time_ns()
        span.end(end_time=end)
        if answered:
            self._replies[ref] = self._tracer.start_span(
                tc.REPLY, context=tc.parent_of(request), start_time=end, attributes=dict(self._attributes)
            )

    def acknowledged(self, refs: list[bytes]) -> None:
        """Redis has the replies to (and the acknowledgements of) ``refs``."""
        replies = self._replies
        if not replies:
            return
        for ref in refs:
            span = replies.pop(ref, None)
            if span is not None:
                span.end()


def _entry_time_ns(ref: bytes) -> int:
    """When Redis added entry ``ref`` (its id's milliseconds; a routed entry's ref is ``to:<replica>/<id>``)."""
    try:
        return int(ref.rpartition(b"/")[2].partition(b"-")[0]) * 1_000_000
    except ValueError:
        return 0
