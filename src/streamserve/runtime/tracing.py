"""OpenTelemetry tracing: whether a process traces, its exporter, and the tracer its requests' spans come from.

A streamserve process (gateway, replica, scheduler, job worker) traces when the standard OpenTelemetry environment
names an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and does not turn
the SDK off (``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER=none``): ``start`` sets the official SDK's tracer
provider up, exporting over OTLP/HTTP in batches from a thread of its own, with the sampler, resource and batch
settings the environment gives (``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``, ``OTEL_BSP_*``...). Otherwise
``tracer()`` is None and no span is ever made: the cost of tracing off is that one test per request.

A program of the user's that calls the farm with the Python client traces when it has set a tracer provider of its
own (the client makes its ``enqueue`` spans with it), and otherwise still passes on a trace context that is current
(one an instrumented framework continued), so that the farm's spans join it.

An exporter that cannot reach its endpoint never holds a request up: spans wait in the batch queue, which drops
the oldest when full, and the failure is logged once (and once more when exports go through again).
"""

from __future__ import annotations

import atexit
import logging
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import NamedTuple

from opentelemetry import trace
from opentelemetry.trace import ProxyTracerProvider, Tracer

logger = logging.getLogger(__name__)

# The instrumentation scope of every span streamserve makes.
SCOPE = "streamserve"
# At exit, spans still queued get this long to be exported (an endpoint that is away cannot hold a stop up longer).
STOP_FLUSH_S = 3.0
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_HTTP_PROTOCOL = "http/protobuf"

_tracer: Tracer | None = None  # this process's, once ``start`` has set tracing up
_stop: Callable[[], None] | None = None  # what ends it: flushes the queue (bounded) and stops the export thread
_user_tracers: dict[int, Tracer] = {}  # a user's own provider's tracer, by the provider's id


class Wanted(NamedTuple):
    """Whether the environment asks for traces; why not, or where they go; and whether it asks for what streamserve
    cannot do (said once at start: the user meant to trace)."""

    on: bool
    why: str
    warn: bool = False


def wanted(environ: Mapping[str, str] = os.environ) -> Wanted:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Wanted(False, "OTEL_SDK_DISABLED=true")
    named = environ.get("OTEL_TRACES_EXPORTER", "otlp")
    exporters = {name.strip().lower() for name in named.split(",")}
    if "otlp" not in exporters:
        if exporters <= {"none", ""}:
            return Wanted(False, f"OTEL_TRACES_EXPORTER={named}")
        return Wanted(False, f"OTEL_TRACES_EXPORTER={named}: streamserve exports spans by OTLP only (otlp)", True)
    endpoint = next((environ[var] for var in _ENDPOINT_VARS if environ.get(var, "").strip()), "")
    if not endpoint:
        return Wanted(False, "no OTEL_EXPORTER_OTLP_ENDPOINT")
    parsed = urllib.parse.urlsplit(endpoint.strip())
    if parsed.scheme.lower() not in ("http", "https") or not parsed.hostname:
        # (Else accepted at start, and every export failed from then on.)
        return Wanted(False, f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint.strip()} is not an http:// or https:// URL", True)
    protocol = next((environ[var] for var in _PROTOCOL_VARS if environ.get(var, "").strip()), _HTTP_PROTOCOL)
    if protocol.strip().lower() != _HTTP_PROTOCOL:
        why = (
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol.strip()}: streamserve exports OTLP over HTTP ({_HTTP_PROTOCOL}) "
            "only; point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318) and unset the protocol"
        )
        return Wanted(False, why, True)
    return Wanted(True, endpoint.strip())


def start(role: str, attributes: Mapping[str, str] | None = None) -> bool:
    """Trace this process (role ``role``: gateway, worker, scheduler, job-worker) if the environment asks for it;
    whether it does. Its spans' resource names the role and, unless ``OTEL_SERVICE_NAME`` (or ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``) names the service, calls it ``streamserve-<role>``."""
    global _tracer, _stop
    on, why, warn = wanted()
    if not on:
        if warn:
            logger.warning("tracing is off: %s", why)
        return False
    if _tracer is not None:
        return True
    from streamserve.runtime.trace_export import export_spans  # the SDK is imported only by a process that traces

    named = {"streamserve.role": role, "service.instance.id": f"{os.uname().nodename}:{os.getpid()}"}
    if not _service_named():
        named["service.name"] = f"streamserve-{role}"
    provider, _stop = export_spans({**named, **(attributes or {})}, why, STOP_FLUSH_S)
    trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer(SCOPE)
    atexit.register(flush)
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceIds())
    logger.info("tracing: spans go to %s (OTLP/HTTP)", why)
    return True


def flush() -> None:
    """Export what is queued (within STOP_FLUSH_S) and stop tracing: at exit, and before a replica restarts itself
    in place (exec)."""
    global _stop
    stop, _stop = _stop, None
    if stop is not None:
        stop()


def tracer() -> Tracer | None:
    """The tracer this process's requests get their spans from, or None: tracing is off."""
    if _tracer is not None:
        return _tracer
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):  # the user set no provider: nothing would record a span
        return None
    found = _user_tracers.get(id(provider))
    if found is None:
        found = _user_tracers[id(provider)] = provider.get_tracer(SCOPE)
    return found


class TraceIds(logging.Filter):
    """Gives a log record the ``trace_id`` of the span current where it was logged (unless it names one itself):
    the text format ends the line with it, the JSON format has it as a field."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            span_context = trace.get_current_span().get_span_context()
            if span_context.is_valid:
                record.trace_id = format(span_context.trace_id, "032x")
        return True


def _service_named() -> bool:
    if os.environ.get("OTEL_SERVICE_NAME", "").strip():
        return True
    pairs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in pairs)
