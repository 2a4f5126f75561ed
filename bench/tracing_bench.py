"""What tracing costs: the HTTP bench's streamserve target with tracing off (the default), on with every request
sampled, and on with 1% sampled, all exporting to a local OTLP sink (bench/otlp_sink.py); alternated in one session
so that drift hits every setting alike.

    .venv/bin/python -m bench.tracing_bench [--quick] [--reps 3] [--duration 10] [--out FILE]
"""

from __future__ import annotations

import sys

from bench.children import Child, Children, child_env
from bench.options import Options
from bench.section import Section
from bench.setting_turns import IN_TURNS, measure_in_turns, table_of
from bench.standalone import standalone
from bench.stats import ratio
from streamserve.runtime.processes import free_port

OFF = "tracing off (default)"
ALL = "tracing on, every request sampled"
SOME = "tracing on, 1% sampled"
SAMPLED_1PCT = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}


def _settings(endpoint: str) -> dict[str, dict[str, str]]:
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    return {OFF: {}, ALL: on, SOME: {**on, **SAMPLED_1PCT}}


def run(opts: Options) -> Section:
    with Children() as sinks:
        port = free_port()
        sink = sinks.start(Child("otlp-sink", [sys.executable, "-m", "bench.otlp_sink", str(port)], child_env()))
        sink.wait_for_line("listening")
        found = measure_in_turns(opts, _settings(f"http://127.0.0.1:{port}"))
    section = Section("tracing", "What OpenTelemetry tracing costs on the HTTP path")
    section.setup = [
        IN_TURNS,
        "On: OTEL_EXPORTER_OTLP_ENDPOINT names a local sink that reads each export and answers 200 "
        "(bench/otlp_sink.py); per request the gateway makes a server and an enqueue span, the replica queue wait, "
        "handler and reply spans, exported in batches (the SDK's defaults). The load sends no traceparent: the "
        "gateway's sampler decides.",
    ]
    section.body = table_of(found)
    base = found[OFF]
    for name in (ALL, SOME):
        r = ratio(found[name][32].rps.median, base[32].rps.median)
        diff_us = (found[name][1].p50_ms.median - base[1].p50_ms.median) * 1000
        section.verdicts.append(f"{name} / off: req/s at c=32 **{r:.3f}**, p50 at c=1 **{diff_us:+.0f} µs**.")
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
