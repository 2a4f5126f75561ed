"""OpenTelemetry tracing through real processes: a farm whose roles export over OTLP/HTTP to a receiver in this
process (tests/harness/otlp_receiver.py, decoding with opentelemetry-proto), called over HTTP with a W3C
traceparent, by the Python client in a program that traces, and through a job; the spans' parent-child structure
spans the gateway and two replicas. Also: a malformed traceparent, errors, cancellation, streams, batches, log
lines, and an endpoint that is away."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.harness.farm import Farm, gateway_process, marked_env, running_farm_of
from tests.harness.otlp_receiver import STATUS_ERROR, OtlpReceiver, ReceivedSpan, otlp_receiver, tree
from tests.harness.paths import ROOT, python_path
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: traced-child
    import_path: tests.trace_deployments:child
  - name: traced-parent
    import_path: tests.trace_deployments:parent
  - name: traced-parent-sync
    import_path: tests.trace_deployments:parent_sync
  - name: traced-fails
    import_path: tests.trace_deployments:fails
  - name: traced-tokens
    import_path: tests.trace_deployments:tokens
  - name: traced-batched
    import_path: tests.trace_deployments:batched
  - name: traced-slow
    import_path: tests.trace_deployments:slow
    graceful_shutdown_timeout_s: 1
  - name: traced-doomed
    import_path: tests.trace_deployments:slow
"""

# Spans leave each process within 100 ms of their end (the batch processor's delay), not 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def farm(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    env = {
        "STREAMSERVE_HEARTBEAT_INTERVAL_S": "0.2",
        "STREAMSERVE_HEARTBEAT_TIMEOUT_S": "2",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_PROPAGATORS": f"{MISSING_PROPAGATOR},tracecontext",  # one not installed here: dropped, with a warning
        **FAST_EXPORT,
    }
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("tracing"), extra_env=env) as farm:
        yield farm


MISSING_PROPAGATOR = "b3"


def test_a_propagator_not_installed_is_named_once_with_its_package(farm: Farm) -> None:
    """Each of the farm's processes said so, the package named "opentelemetry-propagator-<name>" (found by an outside
    tester)."""
    said = f"warning: OTEL_PROPAGATORS names {MISSING_PROPAGATOR}, not installed here (pip install "
    said += f"opentelemetry-propagator-{MISSING_PROPAGATOR}); propagating with tracecontext instead"
    assert farm.log().decode().count(said) == 1, farm.log().decode()[-3000:]


def _traceparent() -> tuple[str, str, str]:
    """A caller's traceparent header, its trace id and its span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def _request_spans(receiver: OtlpReceiver, trace_id: str, hops: int) -> list[ReceivedSpan]:
    """A traced call's spans once ``hops`` calls' replica spans (queue wait, handler, reply) are all in."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        return sum(span.name == "reply" for span in spans) == hops and any(s.kind == "server" for s in spans)

    return receiver.wait_for_trace(trace_id, complete)


@pytest.mark.parametrize("parent", ["traced-parent", "traced-parent-sync"])
def test_an_http_call_continues_the_callers_trace_through_the_gateway_and_two_replicas(
    farm: Farm, receiver: OtlpReceiver, parent: str
) -> None:
    header, trace_id, caller_span = _traceparent()
    resp = farm.post(f"/{parent}", {"x": 1}, headers={"traceparent": header, "tracestate": "vendor=1"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["child"]["trace_id"] == trace_id  # the child's own code runs in the caller's trace

    spans = _request_spans(receiver, trace_id, hops=2)
    children = tree(spans)
    server = _one(spans, f"POST /{parent}")
    assert (server.kind, server.parent_id, server.service) == ("server", caller_span, "streamserve-gateway")
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["http.route"] == f"/{parent}"
    assert server.attributes["streamserve.request_id"] == resp.headers["x-request-id"]

    [enqueue] = children[server.span_id]
    assert (enqueue.name, enqueue.kind) == (f"enqueue {parent}", "producer")
    replica_side = {span.name: span for span in children[enqueue.span_id]}
    assert sorted(replica_side) == ["handler", "queue wait", "reply"]
    wait, handler = replica_side["queue wait"], replica_side["handler"]
    assert wait.attributes["streamserve.queue_wait_ms"] >= 0
    assert wait.start_ns <= enqueue.end_ns  # it waited from when it was sent, not from when the replica took it
    assert wait.start_ns <= wait.end_ns <= handler.start_ns
    assert handler.attributes["streamserve.deployment"] == parent
    assert handler.service == "streamserve-replica"

    [child_enqueue] = children[handler.span_id]  # the handle's call: a child of the parent's handler span
    assert child_enqueue.name == "enqueue traced-child"
    child_side = {span.name: span for span in children[child_enqueue.span_id]}
    assert sorted(child_side) == ["handler", "queue wait", "reply"]
    child_handler = child_side["handler"]
    assert child_handler.attributes["streamserve.parent_request_id"] == handler.attributes["streamserve.request_id"]
    # Three processes: the gateway, the parent's replica and the child's.
    processes = {span.resource["service.instance.id"] for span in (server, handler, child_handler)}
    assert len(processes) == 3, processes


def test_a_malformed_traceparent_is_ignored_and_the_request_starts_a_new_trace(
    farm: Farm, receiver: OtlpReceiver
) -> None:
    resp = farm.post("/traced-child", {"x": 2}, headers={"traceparent": "00-not-a-trace-01"})
    assert resp.status_code == 200, resp.text
    request_id = resp.headers["x-request-id"]

    def server_span() -> list[ReceivedSpan]:
        return receiver.find(lambda s: s.kind == "server" and s.attributes.get("streamserve.request_id") == request_id)

    wait_for(server_span, 30, "no server span")
    [server] = server_span()
    assert server.parent_id == ""  # a root: a new trace
    assert resp.json()["trace_id"] == server.trace_id
    spans = _request_spans(receiver, server.trace_id, hops=1)
    assert {"handler", "queue wait", "reply", "enqueue traced-child"} <= {span.name for span in spans}


def test_a_caller_that_samples_its_trace_out_gets_no_spans_and_its_children_none(
    farm: Farm, receiver: OtlpReceiver
) -> None:
    _, dropped, span_id = _traceparent()
    resp = farm.post("/traced-parent", {"x": 4}, headers={"traceparent": f"00-{dropped}-{span_id}-00"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["child"]["trace_id"] == dropped  # the context still travels, through the handle too
    header, kept, _ = _traceparent()  # a sampled call after it: once its spans are in, the first one's would be
    assert farm.post("/traced-parent", {"x": 5}, headers={"traceparent": header}).status_code == 200
    _request_spans(receiver, kept, hops=2)
    assert receiver.trace(dropped) == []


def test_a_python_client_in_a_traced_program_continues_its_current_span(
    farm: Farm, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    script = tmp_path / "caller.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor

            import streamserve

            provider = TracerProvider(resource=Resource.create({{"service.name": "the-users-program"}}))
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint="{receiver.endpoint}/v1/traces")))
            trace.set_tracer_provider(provider)
            with streamserve.Client() as client, trace.get_tracer("caller").start_as_current_span("user work") as span:
                answer = client.call("traced-child", {{"from": "script"}})
                print(format(span.get_span_context().trace_id, "032x"), answer["trace_id"])
            provider.shutdown()
            """
        )
    )
    env = {**marked_env(farm.token, {}), "REDIS_URL": farm.effective_redis_url, "PYTHONPATH": python_path()}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    trace_id, seen_by_handler = done.stdout.split()
    assert seen_by_handler == trace_id

    def complete(spans: list[ReceivedSpan]) -> bool:
        return any(span.name == "reply" for span in spans) and any(span.name == "user work" for span in spans)

    spans = receiver.wait_for_trace(trace_id, complete)
    work = _one(spans, "user work")
    enqueue = _one(spans, "enqueue traced-child")
    assert (enqueue.parent_id, enqueue.service) == (work.span_id, "the-users-program")
    assert _one(spans, "handler").parent_id == enqueue.span_id


def test_an_error_marks_the_handler_and_server_spans_with_the_exception(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    resp = farm.post("/traced-fails", {"x": 3}, headers={"traceparent": header})
    assert resp.status_code == 500
    spans = _request_spans(receiver, trace_id, hops=1)
    handler = _one(spans, "handler")
    assert handler.status == STATUS_ERROR
    assert "ValueError: no good" in handler.status_message
    [attributes] = [a for name, a in handler.events if name == "exception"]
    assert attributes["exception.type"] == "ValueError"
    assert "no good" in attributes["exception.message"]
    assert "exception.stacktrace" in attributes  # the exception itself, recorded where it was raised
    server = _one(spans, "POST /traced-fails")
    assert server.status == STATUS_ERROR
    assert server.attributes["http.response.status_code"] == 500


def test_a_streams_chunks_are_counted_events_on_its_handler_span(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    resp = farm.post("/traced-tokens", {"n": 40}, headers={"traceparent": header})
    assert resp.status_code == 200
    assert len(resp.text.splitlines()) == 40
    handler = _one(_request_spans(receiver, trace_id, hops=1), "handler")
    chunk_events = [attributes for name, attributes in handler.events if name == "chunks"]
    assert chunk_events and sum(e["streamserve.chunks"] for e in chunk_events) == 40
    assert handler.attributes["streamserve.chunks"] == 40
    assert not any(span.name == "chunk" for span in receiver.trace(trace_id))  # no span per chunk


def test_a_stream_cut_by_its_deadline_says_how_many_chunks_it_sent(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    with contextlib.suppress(httpx.HTTPError):  # NDJSON: an error line, then the connection is cut
        farm.post(
            "/traced-tokens",
            {"n": 5, "then_wait_s": 30},
            headers={"traceparent": header, "X-Request-Timeout": "1"},
        )
    spans = receiver.wait_for_trace(trace_id, lambda spans: any(s.name == "handler" for s in spans))
    handler = _one(spans, "handler")
    assert handler.attributes["streamserve.outcome"] == "deadline_exceeded", handler.attributes
    assert handler.attributes["streamserve.chunks"] == 5, handler.attributes


def test_a_batched_requests_handler_span_says_its_batch_size(farm: Farm, receiver: OtlpReceiver) -> None:
    calls = [_traceparent() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda c: farm.post("/traced-batched", {"n": 1}, headers={"traceparent": c[0]}), calls))
    assert [a.status_code for a in answers] == [200] * 4
    handlers = [_one(_request_spans(receiver, trace_id, 1), "handler") for _, trace_id, _ in calls]
    sizes = [handler.attributes["streamserve.batch_size"] for handler in handlers]
    assert all(1 <= size <= 4 for size in sizes) and max(sizes) > 1, sizes


def test_a_request_whose_caller_hangs_up_is_marked_cancelled(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{farm.base_url}/traced-slow", json={"sleep_s": 30}, headers={"traceparent": header}, timeout=1)

    def ended(spans: list[ReceivedSpan]) -> bool:
        return any(s.name == "handler" for s in spans) and any(s.kind == "server" for s in spans)

    spans = receiver.wait_for_trace(trace_id, ended)
    server, handler = _one(spans, "POST /traced-slow"), _one(spans, "handler")
    assert server.attributes["streamserve.outcome"] == "cancelled" and server.status == STATUS_ERROR
    assert handler.attributes["streamserve.outcome"] == "cancelled" and handler.status == STATUS_ERROR
    assert not [name for name, _ in handler.events if name == "exception"]  # nothing raised: it was stopped
    assert handler.end_ns - handler.start_ns < 10e9  # stopped, not run to its end


def test_a_request_whose_replica_dies_shows_both_deliveries_in_its_trace(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(farm.post, "/traced-doomed", {"sleep_s": 2}, headers={"traceparent": header})
        taken = receiver.wait_for_trace(trace_id, lambda spans: any(s.name == "queue wait" for s in spans))
        [first_wait] = [span for span in taken if span.name == "queue wait"]
        host_pid = str(first_wait.resource["service.instance.id"])  # the replica that took it: host:pid
        os.kill(int(host_pid.rpartition(":")[2]), signal.SIGKILL)
        assert answer.result(timeout=60).status_code == 200

    def delivered_again(spans: list[ReceivedSpan]) -> bool:
        return any(s.name == "reply" for s in spans) and sum(s.name == "queue wait" for s in spans) == 2

    spans = receiver.wait_for_trace(trace_id, delivered_again)
    enqueue = _one(spans, "enqueue traced-doomed")
    handler = _one(spans, "handler")  # the dead replica's never left it
    assert handler.parent_id == enqueue.span_id and handler.attributes["streamserve.attempts"] == 1
    assert handler.resource["service.instance.id"] != host_pid


def test_the_gateway_s_own_routes_make_no_spans(farm: Farm, receiver: OtlpReceiver) -> None:
    """Probes, scrapes and the dashboard's polls are not traced (FastAPI's own telemetry would trace each with the
    farm's tracer provider): only requests to deployments are."""
    probed, probe_trace, _ = _traceparent()
    for path in ("/-/healthz", "/-/ready", "/metrics", "/-/status", "/-/dashboard/data", "/-/nothing"):
        httpx.get(farm.base_url + path, headers={"traceparent": probed}, timeout=30)
    header, trace_id, _ = _traceparent()
    assert farm.post("/traced-child", {"x": 1}, headers={"traceparent": header}).status_code == 200
    _request_spans(receiver, trace_id, 1)  # exported after the probes' would have been, by the same gateway
    assert receiver.trace(probe_trace) == []
    assert receiver.find(lambda span: span.name.startswith(("GET ", "fastapi."))) == []


def test_a_jobs_run_links_to_the_request_that_queued_it(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    resp = farm.post("/traced-child", {"job": 1}, headers={"traceparent": header, "Prefer": "respond-async"})
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["job_id"]
    submitted = _one(receiver.wait_for_trace(trace_id, lambda spans: len(spans) >= 2), "enqueue job traced-child")

    def job_span() -> list[ReceivedSpan]:
        return receiver.find(
            lambda s: s.name == "job traced-child" and s.attributes.get("streamserve.job_id") == job_id
        )

    wait_for(job_span, 30, "no job span")
    [job] = job_span()
    assert job.service == "streamserve-job-worker"
    assert job.links == [(trace_id, submitted.span_id)]
    run = receiver.wait_for_trace(job.trace_id, lambda spans: any(s.name == "reply" for s in spans))
    enqueue = _one(run, "enqueue traced-child")
    assert enqueue.parent_id == job.span_id
    assert _one(run, "handler").parent_id == enqueue.span_id


def test_log_lines_about_a_traced_request_carry_its_trace_id(farm: Farm, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = _traceparent()
    assert farm.post("/traced-child", {"log": 1}, headers={"traceparent": header}).status_code == 200

    def lines() -> list[str]:
        return [line for line in farm.log().decode(errors="replace").splitlines() if f"trace_id={trace_id}" in line]

    def both() -> bool:  # the handler's own line, and the gateway's access line
        found = lines()
        return any("traced child serving" in line for line in found) and any(
            "streamserve.access" in line and "/traced-child 200" in line for line in found
        )

    wait_for(both, 30, lambda: f"log lines with the trace id: {lines()}")


def test_a_gateway_stopped_right_after_a_request_exports_its_spans(
    farm: Farm, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Its batch waits 5 s (the SDK's default) to go: stopped before then, it must still send it (docs/tracing.md: a
    stopping process gives its last spans 3 seconds). uvicorn ends the process with the stop signal itself once it
    has shut down, before the process's exit hooks could export them."""
    header, trace_id, _ = _traceparent()
    with gateway_process(farm.effective_redis_url, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint) as port:
        resp = httpx.post(f"http://127.0.0.1:{port}/traced-child", json={}, headers={"traceparent": header}, timeout=30)
        assert resp.status_code == 200, resp.text
    # (stopped at once with SIGTERM, as `up` stops its gateway)
    spans = receiver.wait_for_trace(trace_id, lambda spans: any(span.kind == "server" for span in spans))
    assert _one(spans, "POST /traced-child").kind == "server"
    _one(spans, "enqueue traced-child")


def test_an_unreachable_endpoint_never_fails_a_request_and_is_logged_once(farm: Farm, tmp_path: Path) -> None:
    away = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}  # nobody there
    with gateway_process(farm.effective_redis_url, tmp_path, **away, **FAST_EXPORT) as port:
        log = next(tmp_path.glob("gateway-*.log"))
        # Requests for 3 s (at most 300): several export rounds fail meanwhile, each with spans dropped.
        ends = time.monotonic() + 3
        for i in range(300):
            resp = httpx.post(f"http://127.0.0.1:{port}/traced-child", json={"i": i}, timeout=10)
            assert resp.status_code == 200, resp.text
            if time.monotonic() > ends:
                break
        wait_for(lambda: "cannot export spans" in log.read_text(), 30, lambda: log.read_text()[-2000:])
    text = log.read_text()
    assert text.count("cannot export spans") == 1, text[-3000:]
    assert "opentelemetry" not in text, text[-3000:]  # nor the SDK's own line per failed batch
