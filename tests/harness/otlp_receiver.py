"""A test OTLP/HTTP receiver: takes ``POST /v1/traces`` (protobuf, as the official exporter sends it, gzip or not),
decodes it with ``opentelemetry-proto`` and keeps every span, for tests to look at. No OpenTelemetry Collector
installs from the package registries; this speaks the same protocol on a loopback port of its own."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from tests.harness.waiting import wait_for

# Status codes as OTLP has them.
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
KINDS = {
    ProtoSpan.SPAN_KIND_INTERNAL: "internal",
    ProtoSpan.SPAN_KIND_SERVER: "server",
    ProtoSpan.SPAN_KIND_CLIENT: "client",
    ProtoSpan.SPAN_KIND_PRODUCER: "producer",
    ProtoSpan.SPAN_KIND_CONSUMER: "consumer",
}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


@dataclass
class ReceivedSpan:
    """One span as received: ids in hex, the sending process's ``service`` name and ``pid`` (from its resource)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str
    resource: dict[str, Any] = field(repr=False)


class OtlpReceiver:
    """The receiver on 127.0.0.1 (a free port); ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def _take(self, export: ExportTraceServiceRequest) -> None:
        taken = []
        for resource_spans in export.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    taken.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=KINDS.get(span.kind, "unspecified"),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            status=span.status.code,
                            status_message=span.status.message,
                            events=[(e.name, {kv.key: _value(kv.value) for kv in e.attributes}) for e in span.events],
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            service=str(resource.get("service.name", "")),
                            resource=resource,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(taken)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def find(self, predicate: Callable[[ReceivedSpan], bool]) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if predicate(span)]

    def wait_for_trace(
        self, trace_id: str, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30
    ) -> list[ReceivedSpan]:
        """The spans of trace ``trace_id`` once ``done`` says they are all in."""
        wait_for(lambda: done(self.trace(trace_id)), timeout_s, lambda: f"trace {trace_id}: {self.trace(trace_id)}")
        return self.trace(trace_id)

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


def tree(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    """Parent span id -> its children."""
    children: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_id, []).append(span)
    return children


def names(spans: list[ReceivedSpan]) -> list[str]:
    return sorted(span.name for span in spans)
