"""The gateway's server span of a deployment POST, when it traces (runtime/tracing.py): the caller's trace context
(``traceparent``/``tracestate``, or whatever propagators OTEL_PROPAGATORS names) continued, a malformed one
ignored (a new trace starts), and the HTTP semantic conventions' attributes."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import propagate
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from starlette.types import Scope

from streamserve.app.observe import CLIENT_CLOSED
from streamserve.runtime.trace_context import OUTCOME, REQUEST_ID

Headers = Iterable[tuple[bytes, bytes]]


class _AsgiHeaders(Getter[Headers]):
    """Reads propagation headers from ASGI's raw (lower-cased name, value) pairs."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        name = key.lower().encode("latin-1")
        values = [value.decode("latin-1") for header, value in carrier if header == name]
        return values or None

    def keys(self, carrier: Headers) -> list[str]:
        return [header.decode("latin-1") for header, _ in carrier]


_GETTER = _AsgiHeaders()


def start_server_span(tracer: Tracer, scope: Scope) -> Span:
    """The span of one deployment POST, a child of the caller's context if it sent one. (Its other attributes are
    set only once it is known to be recorded: ``end_server_span``.)"""
    parent = propagate.extract(scope["headers"], getter=_GETTER)
    return tracer.start_span(scope["method"], context=parent, kind=SpanKind.SERVER)


def end_server_span(
    span: Span, scope: Scope, status: int, route: str | None, error: BaseException | None, request_id: str
) -> None:
    """End the (recorded) span of request ``request_id`` (``scope``: its ASGI scope), answered with ``status``
    (CLIENT_CLOSED: its caller left) through ``route`` (the route prefix that matched, None for none); ``error``: the
    error it was answered with."""
    attributes: dict[str, str | int] = {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
        REQUEST_ID: request_id,
    }
    if server := scope.get("server"):
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    if client := scope.get("client"):
        attributes["client.address"] = client[0]
    if agent := _GETTER.get(scope["headers"], "user-agent"):
        attributes["user_agent.original"] = agent[0]
    span.set_attributes(attributes)
    if route is not None:
        span.update_name(f"POST {route}")
        span.set_attribute("http.route", route)
    if status == CLIENT_CLOSED:
        span.set_attribute(OUTCOME, "cancelled")
        span.set_status(Status(StatusCode.ERROR, "cancelled: the caller disconnected"))
    else:
        span.set_attribute("http.response.status_code", status)
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        if status >= 500:  # a server span's status is an error for 5xx only (the conventions': 4xx is the caller's)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    elif status >= 500 and status != CLIENT_CLOSED:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
