"""Streaming: chunks/s and time to first chunk through one gateway, beside a bare FastAPI app and Ray Serve; chunk
delay at 1,000 (and 250) token-rate streams; disconnect to CancelledError.

Each stream is ``POST /stream`` answered by 200 small JSON chunks (bench/stream_chunks.py), yielded as fast as the
generator can. At 1, 10 and 100 concurrent streams (closed loop, keep-alive connections, a raw-socket HTTP/1.1
client: bench/stream_client.py), each target alone, repeated ``reps`` times:

- streamserve: `streamserve up` (one gateway process, embedded Redis), deployment ``chunks`` (an async generator,
  REPLICAS replicas);
- the ceiling: bench/bare_stream_app.py, a FastAPI ``StreamingResponse`` of the same chunks, on the gateway's
  uvicorn settings;
- the peer: Ray Serve (bench/compare/ray_stream.py) in a virtualenv of its own, given by ``--ray-python`` (or
  $BENCH_RAY_PYTHON); without it Ray is skipped with a note.

Also, on streamserve: a unary call's p50 through the same gateway (what the first chunk is held against); 1,000
concurrent streams of 50 chunks/s each (and the same on the bare app), each chunk's delay from ``yield`` to the
client; and from closing the connection to CancelledError in an async handler, unary and generator.

    .venv/bin/python -m bench.stream_bench [--quick] [--reps N] [--ray-python PATH] [--out FILE]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson
import uvloop

from bench.children import Child, Children, child_env
from bench.farm import start_farm
from bench.options import RAY_PYTHON_VAR, Options
from bench.section import Section, md_table, verdict
from bench.servers import py
from bench.standalone import standalone
from bench.stats import Summary, ratio
from bench.stream_chunks import CHUNKS_PER_STREAM, RAY_READY, chunk
from bench.stream_phases import (
    BODY,
    PATH,
    SETTLE_S,
    SPACED_GAP_S,
    TICK_LEVELS,
    TICK_PER_S,
    TICK_STREAMS,
    DelayRow,
    SpacedRow,
    StreamRow,
    StreamRun,
    measure_disconnects,
    measure_spaced,
    measure_streams,
    measure_ticks,
    measure_unary,
)
from streamserve.runtime.fd_limit import raise_fd_limit
from streamserve.runtime.processes import free_port

TITLE = "Streaming: NDJSON streams through one gateway vs bare FastAPI vs Ray Serve"
MAX_ONGOING = 1000  # per replica: every stream of the 1,000-stream phase fits on one
# Ray's cold start (a local cluster, Serve's controller and proxy, the replicas) takes 10-20 s on 2 cores.
RAY_READY_S = 180.0
LABELS = {"streamserve": "streamserve gateway", "bare": "bare FastAPI (ceiling)", "ray": "Ray Serve"}


def farm_config(replicas: int) -> str:
    return f"""\
deployments:
  - name: chunks
    import_path: bench.deployments:chunks
    num_replicas: {replicas}
    max_ongoing_requests: {MAX_ONGOING}
    max_queued_requests: 5000
    route_prefix: {PATH}
  - name: noop
    import_path: examples.functions:noop
    num_replicas: 1
    max_ongoing_requests: 32
    route_prefix: /noop
  - name: cancel-unary
    import_path: bench.deployments:wait_cancelled
    num_replicas: 1
    max_ongoing_requests: 64
    route_prefix: /cancel-unary
  - name: cancel-stream
    import_path: bench.deployments:chunk_then_wait_cancelled
    num_replicas: 1
    max_ongoing_requests: 64
    route_prefix: /cancel-stream
"""


# -- the targets ------------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """Everything one run found; a target that did not run is absent."""

    streams: dict[str, dict[int, StreamRow]]
    unary: Summary | None = None
    spaced: SpacedRow | None = None
    ticks: dict[str, dict[int, DelayRow]] | None = None  # by target, then number of streams
    disconnects: dict[str, DelayRow] | None = None
    ray_note: str = ""


def run_streamserve(run: StreamRun, found: Measured) -> None:
    with Children() as children:
        farm = start_farm(children, farm_config(run.replicas))

        async def measure() -> None:
            found.streams["streamserve"] = await measure_streams("streamserve", farm.port, run)
            found.unary = await measure_unary(farm.port, run)
            found.spaced = await measure_spaced(farm.port, run)
            found.disconnects = await measure_disconnects(farm.port, farm.effective_redis_url, run)
            found.ticks = {"streamserve": await measure_ticks("streamserve", farm.port, run)}

        uvloop.run(measure())


def run_bare(run: StreamRun, found: Measured) -> None:
    with Children() as children:
        port = free_port()
        children.start(Child("bare-stream-app", py("bench.bare_stream_app", "--port", str(port)))).wait_listening(port)

        async def measure() -> None:
            found.streams["bare"] = await measure_streams("bare", port, run)
            assert found.ticks is not None
            found.ticks["bare"] = await measure_ticks("bare", port, run)

        uvloop.run(measure())


def run_ray(run: StreamRun, found: Measured) -> None:
    with Children() as children:
        port = free_port()
        argv = [run.ray_python, "-m", "bench.compare.ray_stream", "--port", str(port)]
        argv += ["--replicas", str(run.replicas), "--max-ongoing", str(MAX_ONGOING)]
        ray = children.start(Child("ray-serve", argv, env=child_env(RAY_USAGE_STATS_ENABLED="0")))
        found.ray_note = ray.wait_for_line(RAY_READY, RAY_READY_S).strip().removeprefix(RAY_READY).strip()
        ray.wait_listening(port)
        found.streams["ray"] = uvloop.run(measure_streams("ray", port, run))


def measure_all(run: StreamRun) -> Measured:
    raise_fd_limit()  # 1,000 streams hold 1,000 sockets here
    found = Measured(streams={}, ticks={})
    run_streamserve(run, found)
    run_bare(run, found)
    if run.ray_python:
        run_ray(run, found)
    return found


def run(opts: Options) -> Section:
    stream_run = StreamRun.of(opts)
    return section(measure_all(stream_run), stream_run)


# -- the section ------------------------------------------------------------------------------------------------


def section(found: Measured, run: StreamRun) -> Section:
    """Tables and verdicts; the run's facts (machine, load, commit) are added by whoever writes the file."""
    out = Section("stream", TITLE)
    out.setup = setup_lines(found, run)
    rows = []
    for target, by_c in found.streams.items():
        for concurrency, row in by_c.items():
            rows.append(
                [
                    LABELS[target],
                    str(concurrency),
                    row.chunks_per_s.fmt(0),
                    row.ttfc_p50_ms.fmt(2),
                    row.ttfc_p99_ms.fmt(2),
                    str(row.errors),
                ]
            )
    out.body = md_table(["target", "streams", "chunks/s", "first chunk p50 ms", "first chunk p99 ms", "errors"], rows)
    if found.unary is not None:
        u = found.unary
        out.body += ["", f"Unary `POST /noop` through the same gateway, one at a time: p50 {u.p50_ms.fmt(3)} ms, "]
        out.body[-1] += f"p99 {u.p99_ms.fmt(3)} ms, {u.errors} errors."
    if found.spaced is not None:
        sp = found.spaced
        out.body += [
            "",
            f"Spaced requests, each {SPACED_GAP_S * 1000:g} ms after the last answer (a unary `POST /noop` and a "
            f"200-chunk stream in turn, {sp.count:,} of each): each finds the farm idle, as a chat's first token "
            f"usually does. Unary p50 {sp.unary_p50_ms.fmt(3)} ms, the stream's first chunk p50 "
            f"{sp.first_chunk_p50_ms.fmt(3)} ms.",
        ]
    if found.ticks:
        levels = ", ".join(f"{n:,}" for n in TICK_LEVELS)
        out.body += [
            "",
            f"{levels} concurrent streams of {TICK_PER_S:g} chunks/s each (a language model's token rate; "
            f"{TICK_STREAMS * TICK_PER_S:,.0f} chunks/s due at {TICK_STREAMS:,}): each chunk's delay from the "
            "handler's `yield` to the client's read, over the chunks yielded while all streams ran, and from when "
            "it was due (the generator's schedule: a process that runs its generators late yields late) to the "
            "client's read, over the chunks due then:",
            "",
            *md_table(
                [
                    "target",
                    "streams",
                    "chunks measured",
                    "chunks/s delivered",
                    "delay p50 ms",
                    "delay p99 ms",
                    "due -> client p99 ms",
                    "client cores",
                    "errors",
                ],
                [
                    [
                        LABELS[t],
                        f"{n:,}",
                        f"{r.count:,}",
                        r.rate.fmt(0) if r.rate else "n/a",
                        r.p50_ms.fmt(2),
                        r.p99_ms.fmt(2),
                        r.late_p99_ms.fmt(2) if r.late_p99_ms else "n/a",
                        r.client_cores.fmt(2) if r.client_cores else "n/a",
                        str(r.errors),
                    ]
                    for t, by_n in found.ticks.items()
                    for n, r in by_n.items()
                ],
            ),
        ]
    if found.disconnects:
        out.body += [
            "",
            "From the client closing its connection to `asyncio.CancelledError` in the handler (one at a time):",
            "",
            *md_table(
                ["async handler", "disconnects", "p50 ms", "p99 ms", "not cancelled within 5 s"],
                [
                    [kind, str(r.count), r.p50_ms.fmt(2), r.p99_ms.fmt(2), str(r.errors)]
                    for kind, r in found.disconnects.items()
                ],
            ),
        ]
    first_errors = [
        f"{LABELS[t]} at {c} streams: `{r.first_error}`"
        for t, by_c in found.streams.items()
        for c, r in by_c.items()
        if r.first_error
    ]
    first_errors += [
        f"{LABELS[t]}, {n:,} token-rate streams: `{r.first_error}`"
        for t, by_n in (found.ticks or {}).items()
        for n, r in by_n.items()
        if r.first_error
    ]
    if first_errors:
        out.body += ["", "First error of each row with errors: " + "; ".join(first_errors) + "."]
    out.verdicts = verdicts(found)
    return out


def setup_lines(found: Measured, run: StreamRun) -> list[str]:
    ray = (
        f"Ray Serve: `bench/compare/ray_stream.py` in its own virtualenv (`{run.ray_python}`; {found.ray_note}): "
        f"a FastAPI ingress (`@serve.ingress`) returning a `StreamingResponse` of the same lines, Serve's default "
        f"HTTP proxy (one process), {run.replicas} replicas with max_ongoing_requests {MAX_ONGOING}, Ray's defaults "
        "otherwise (its request logs included)."
        if run.ray_python
        else f"Ray Serve: skipped, no Ray virtualenv given (`--ray-python PATH` or ${RAY_PYTHON_VAR}; see "
        'bench/README.md, "Ray Serve").'
    )
    return [
        f"Each stream: `POST {PATH}` `{BODY.decode()}`, answered by {CHUNKS_PER_STREAM} NDJSON lines "
        f"`{orjson.dumps(chunk(0)).decode()}`... yielded as fast as an async generator can (bench/stream_chunks.py). "
        "The client: one asyncio + uvloop process, HTTP/1.1 on raw sockets, one keep-alive connection per stream at "
        "a time, closed loop (a connection posts its next stream when the last one ended); chunks/s counts the lines "
        "received; first chunk is from writing the request to reading the first whole line.",
        f"streamserve: `streamserve up`, embedded Redis, 1 gateway process, deployment `chunks` = that generator "
        f"(`bench.deployments:chunks`), {run.replicas} replicas, max_ongoing_requests {MAX_ONGOING}, "
        "max_unread_chunks 64 (the default), metrics and access log on (the defaults).",
        f"Why {run.replicas} replicas: a replica is one Python process and its event loop; at 100 fast streams, or "
        "1,000 token-rate ones, one alone can need a whole core, and the gateway must be what is measured. More "
        "than the machine's 2 cores would only add processes competing for them (and split the XADDs a replica "
        "batches). The generator is async: a sync one runs on handler threads and hands each chunk to the loop.",
        "bare: `bench/bare_stream_app.py`, a FastAPI `StreamingResponse` of the same generator, each value one "
        "NDJSON line, on the gateway's uvicorn settings (uvloop, httptools, 1 process, no access log). It writes "
        "each line as an HTTP chunk of its own (so does Ray's); the gateway writes what one read of its reply stream "
        "brought as one, so with many streams it can pass this ceiling.",
        ray,
        f"Each target runs alone. Phases: {run.warmup_s:g} s warm-up + {run.phase_s:g} s; repetitions per row: "
        f"{run.reps}; token-rate streams start evenly over {run.tick_ramp_s:g} s and run {run.tick_hold_s:g} s, "
        f"measured from {SETTLE_S:g} s after the last started; {run.disconnects} disconnects per handler kind.",
    ]


def verdicts(found: Measured) -> list[str]:
    out = []
    ss, bare, ray = found.streams.get("streamserve"), found.streams.get("bare"), found.streams.get("ray")
    if ss and ray:
        for c in (10, 100):
            r = ratio(ss[c].chunks_per_s.median, ray[c].chunks_per_s.median)
            out.append(
                f"Chunks/s at {c} streams, streamserve / Ray Serve: **{r:.2f}x** (goal >= 1.5x: {verdict(r >= 1.5)})."
            )
    elif ss:
        out.append("Chunks/s, streamserve / Ray Serve: n/a (Ray Serve skipped).")
    if ss and bare:
        ratios = ", ".join(f"{ratio(ss[c].chunks_per_s.median, bare[c].chunks_per_s.median):.2f}x at {c}" for c in ss)
        out.append(f"Chunks/s, streamserve / bare FastAPI: {ratios}.")
    if ss and found.unary is not None:
        diff = ss[1].ttfc_p50_ms.median - found.unary.p50_ms.median
        out.append(
            f"First chunk p50 at 1 stream - unary p50 through the same gateway, back to back: **{diff:+.2f} ms** "
            f"(goal <= +0.5 ms: {verdict(diff <= 0.5)})."
        )
    if found.spaced is not None:
        diff = found.spaced.difference_ms
        out.append(
            f"First chunk p50 - unary p50, requests {SPACED_GAP_S * 1000:g} ms apart: **{diff:+.2f} ms** "
            f"(goal <= +0.5 ms: {verdict(diff <= 0.5 if not math.isnan(diff) else None)})."
        )
    if ss and ray:
        r = ratio(ss[1].ttfc_p50_ms.median, ray[1].ttfc_p50_ms.median)
        out.append(
            f"First chunk p50 at 1 stream, streamserve / Ray Serve: **{r:.3f}** (goal < 0.1: {verdict(r < 0.1)})."
        )
    ticks = found.ticks or {}
    if TICK_STREAMS in ticks.get("streamserve", {}):
        p99 = ticks["streamserve"][TICK_STREAMS].p99_ms.median
        out.append(
            f"{TICK_STREAMS:,} streams at {TICK_PER_S:g} chunks/s, yield -> client p99: **{p99:.1f} ms** "
            f"(goal < 20 ms: {verdict(p99 < 20 if not math.isnan(p99) else None)})."
        )
        if TICK_STREAMS in ticks.get("bare", {}):
            bare = ticks["bare"][TICK_STREAMS]
            out[-1] += f" The bare FastAPI ceiling's p99 there: {bare.p99_ms.median:.1f} ms"
            if bare.late_p99_ms is not None:
                out[-1] += f", and from when a chunk was due: {bare.late_p99_ms.median:.1f} ms"
            out[-1] += "."
    for kind, row in (found.disconnects or {}).items():
        p99 = row.p99_ms.median
        missed = f"; {row.errors} not cancelled" if row.errors else ""
        out.append(
            f"Disconnect -> CancelledError, async {kind} handler, p99: **{p99:.1f} ms** "
            f"(goal < 100 ms: {verdict(p99 < 100 and not row.errors if not math.isnan(p99) else None)}){missed}."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "streams: streamserve vs bare FastAPI vs Ray Serve", argv)


if __name__ == "__main__":
    raise SystemExit(main())
