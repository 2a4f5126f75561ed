"""Tracing's pure parts: when the environment turns it on, the trace fields of a stream entry, links, log ids, and
an exporter whose outage is logged once."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from streamserve.runtime import trace_context
from streamserve.runtime.propagators import drop_missing_propagators
from streamserve.runtime.trace_export import OnceLoggedExporter
from streamserve.runtime.tracing import wanted
from streamserve.wire.messages import Request

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False),
    ],
)
def test_tracing_is_on_when_the_environment_names_an_otlp_endpoint(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ)[0] is on


@pytest.mark.parametrize("endpoint", ["not-a-url", "127.0.0.1:4318", "ftp://c:4318", "http://"])
def test_an_endpoint_that_is_no_http_url_is_said_at_start(endpoint: str) -> None:
    said = wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert not said.on and said.warn
    assert said.why == f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint} is not an http:// or https:// URL"


def test_grpc_is_refused_with_the_reason() -> None:
    _, why, warn = wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}
    )
    assert "http/protobuf" in why and "4318" in why and warn


@pytest.mark.parametrize(("exporter", "warn"), [("console", True), ("jaeger,zipkin", True), ("none", False)])
def test_an_exporter_other_than_otlp_is_said_at_start_and_none_is_not(exporter: str, warn: bool) -> None:
    said = wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": exporter})
    assert not said.on and said.warn is warn
    assert f"OTEL_TRACES_EXPORTER={exporter}" in said.why


def test_a_requests_trace_fields_travel_in_its_entry_and_only_when_set() -> None:
    plain = Request("r1", "reply", 0, b"1")
    assert not {"trace", "trace_state", "sent_ns"} & set(plain.encode())
    traced = Request("r1", "reply", 0, b"1", trace=TRACEPARENT, trace_state="vendor=1", sent_ns=123)
    fields = {k.encode(): str(v).encode() if not isinstance(v, bytes) else v for k, v in traced.encode().items()}
    back = Request.decode(fields)
    assert (back.trace, back.trace_state, back.sent_ns) == (TRACEPARENT, "vendor=1", 123)
    assert trace_context.log_ids(back) == {"trace_id": "0af7651916cd43dd8448eb211c80319c"}
    assert trace_context.log_ids(plain) == {}


def test_the_replica_continues_the_entrys_context_and_ignores_a_malformed_one() -> None:
    from opentelemetry import trace

    parent = trace.get_current_span(trace_context.parent_of(Request("r", "", 0, b"", trace=TRACEPARENT)))
    assert format(parent.get_span_context().trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    broken = trace.get_current_span(trace_context.parent_of(Request("r", "", 0, b"", trace="00-nope-01")))
    assert not broken.get_span_context().is_valid  # a new trace starts
    assert trace_context.link_to("") == [] and trace_context.link_to("garbage") == []
    [link] = trace_context.link_to(TRACEPARENT)
    assert format(link.context.span_id, "016x") == "b7ad6b7169203331"


class _Flaky(SpanExporter):
    def __init__(self, results: list[SpanExportResult]) -> None:
        self.results = results

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.results.pop(0)


def test_an_outage_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    ok, failed = SpanExportResult.SUCCESS, SpanExportResult.FAILURE
    exporter = OnceLoggedExporter(_Flaky([ok, failed, failed, failed, ok, ok, failed]), "http://collector:4318")
    with caplog.at_level(logging.INFO, "streamserve.runtime.tracing"):
        results = [exporter.export([]) for _ in range(7)]
    assert results == [ok, failed, failed, failed, ok, ok, failed]
    messages = [record.getMessage() for record in caplog.records]
    assert [m.split(" ")[1] for m in messages] == ["cannot", "spans", "cannot"]


def test_an_exporter_that_raises_is_a_failed_export_not_a_dead_thread(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            raise ConnectionError("refused")

    with caplog.at_level(logging.WARNING, "streamserve.runtime.tracing"):
        assert OnceLoggedExporter(Broken(), "http://x").export([]) is SpanExportResult.FAILURE
    assert "ConnectionError: refused" in caplog.text


def test_the_sampled_flag_is_read_from_a_traceparent() -> None:
    assert trace_context.sampled(TRACEPARENT)
    assert not trace_context.sampled(TRACEPARENT[:-2] + "00")
    assert trace_context.sampled("garbage!")  # unreadable: left to the sampler


@pytest.mark.parametrize(
    ("given", "kept", "said"),
    [
        ("b3,tracecontext", "tracecontext", "names b3, not installed here (pip install opentelemetry-propagator-b3)"),
        ("b3multi,xray,b3", None, "(pip install opentelemetry-propagator-aws-xray opentelemetry-propagator-b3)"),
        ("b3", None, "propagating with tracecontext, baggage instead"),
        ("tracecontext,baggage", "tracecontext,baggage", ""),
        ("none", "none", ""),
    ],
)
def test_propagators_not_installed_are_dropped_and_named(given: str, kept: str | None, said: str) -> None:
    environ = {"OTEL_PROPAGATORS": given}
    message = drop_missing_propagators(environ)
    assert environ.get("OTEL_PROPAGATORS") == kept
    assert (said in message) if said else message == ""
