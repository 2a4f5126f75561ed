"""The OpenTelemetry SDK set up for a process that traces (runtime/tracing.py): a tracer provider whose spans go
in batches, from a thread of their own, to the OTLP/HTTP exporter; an outage is logged once, not per batch."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

logger = logging.getLogger("streamserve.runtime.tracing")

# The SDK's and exporter's loggers, which would log each failed export (at ERROR), and each span dropped from a full
# queue on the thread that ended it (a request's): quiet but for CRITICAL; OnceLoggedExporter logs an outage once.
_NOISY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
)


def export_spans(
    attributes: Mapping[str, str], endpoint: str, stop_within_s: float
) -> tuple[TracerProvider, Callable[[], None]]:
    """A tracer provider exporting to ``endpoint`` (the rest of the exporter's settings, and the sampler's, from the
    environment), with ``attributes`` on its resource; and what stops it: the queued spans exported within
    ``stop_within_s``, or dropped at once while the endpoint is known to be away."""
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    exporter = OnceLoggedExporter(OTLPSpanExporter(), endpoint)
    processor = BatchSpanProcessor(exporter)
    provider = TracerProvider(resource=Resource.create(dict(attributes)), shutdown_on_exit=False)
    provider.add_span_processor(processor)

    def stop() -> None:
        if exporter.failing:  # an export waiting to retry would hold the stop up until its timeout
            exporter.shutdown()
        # The SDK's shutdown waits up to 30 s for an export under way: on a thread of its own, waited for so long.
        closing = threading.Thread(target=processor.shutdown, name="streamserve-trace-stop", daemon=True)
        closing.start()
        closing.join(stop_within_s)

    return provider, stop


class OnceLoggedExporter(SpanExporter):
    """An exporter whose failures are logged once per outage, and once more when exports go through again."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = endpoint
        self.failing = False
        self._lock = threading.Lock()
        self._shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shut:
            return SpanExportResult.FAILURE
        try:
            result = self._exporter.export(spans)
            reason = "it refused them, or did not answer within OTEL_EXPORTER_OTLP_TIMEOUT"
        except Exception as exc:  # never let the export thread die
            result, reason = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                if self.failing:
                    self.failing = False
                    logger.info("tracing: spans reach %s again", self._endpoint)
            elif not self.failing:
                self.failing = True
                logger.warning(
                    "tracing: cannot export spans to %s (%s); requests go on, and their spans are dropped meanwhile",
                    self._endpoint,
                    reason,
                )
        return result

    def shutdown(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)
