"""The phases of the stream bench (bench/stream_bench.py) on one target, each target alike: what a stream is, how
long and how often each phase runs, and what it reduces to over the repetitions."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from bench.loadgen import NOOP_BODY, http_measure, post_request
from bench.options import Options
from bench.stats import Spread, Summary
from bench.stream_chunks import CHUNKS_PER_STREAM, chunk
from bench.stream_client import StreamConnection, ms_percentiles, stream_measure, stream_probe, timed_streams

PATH = "/stream"
BODY = orjson.dumps({"n": CHUNKS_PER_STREAM})
CONCURRENCIES = (1, 10, 100)
# Replicas of the streaming deployment (and of Ray's): see the section's setup for why two.
REPLICAS = 2
# The token-rate phase: streams, chunks per second each.
TICK_STREAMS = 1000
TICK_PER_S = 50.0
# The token-rate loads measured: the goal's, a half and a quarter of it (where a machine that the goal's load
# saturates, the bare ceiling included, still shows each system's own delay: where the delay starts to grow).
TICK_LEVELS = (TICK_STREAMS, TICK_STREAMS // 2, TICK_STREAMS // 4)
SETTLE_S = 0.5  # measured from this long after the last stream started
# Spaced requests: a unary call and a stream in turn, each this long after the last answer, so that each finds the
# farm idle (as a chat's first token usually does), unlike the back-to-back phases.
SPACED_GAP_S = 0.02


@dataclass(frozen=True)
class StreamRun:
    """How this bench measures, from the shared options: shorter phases than the request benches (a phase of
    streams has thousands of samples in a few seconds), so that the full run stays near 4 minutes."""

    reps: int
    warmup_s: float
    phase_s: float
    tick_ramp_s: float
    tick_hold_s: float
    disconnects: int
    spaced: int  # spaced requests of each kind per repetition
    ray_python: str
    replicas: int = REPLICAS

    @classmethod
    def of(cls, opts: Options) -> StreamRun:
        return cls(
            reps=opts.reps,
            warmup_s=opts.warmup_s / 2,
            phase_s=opts.duration_s * 0.4,
            tick_ramp_s=0.5 if opts.quick else 1.0,
            tick_hold_s=2.5 if opts.quick else 6.0,
            disconnects=20 if opts.quick else 50,
            spaced=50 if opts.quick else 300,
            ray_python=opts.ray_python,
        )


# -- what each target measures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamRow:
    """One target at one concurrency, over the repetitions."""

    chunks_per_s: Spread
    ttfc_p50_ms: Spread
    ttfc_p99_ms: Spread
    errors: int
    first_error: str

    @classmethod
    def of(cls, samples: list[dict[str, Any]]) -> StreamRow:
        summary = Summary.of(samples)
        first = next((s["first_error"] for s in samples if s["first_error"]), "")
        return cls(
            Spread.of([s["chunks_per_s"] for s in samples]), summary.p50_ms, summary.p99_ms, summary.errors, first
        )


@dataclass(frozen=True)
class DelayRow:
    """A distribution of delays in ms over the repetitions (each a median with its range), and what it came from."""

    p50_ms: Spread
    p99_ms: Spread
    count: int  # samples (lines, disconnects) over all repetitions
    errors: int
    first_error: str = ""
    rate: Spread | None = None  # timed streams: lines delivered per second in the window
    client_cores: Spread | None = None  # timed streams: the CPU the client used, in cores
    late_p99_ms: Spread | None = None  # timed streams: from when a line was due (its schedule) to this client, p99


async def measure_streams(target: str, port: int, run: StreamRun) -> dict[int, StreamRow]:
    status, values = await stream_probe(port, PATH, BODY)
    if status != 200 or values != [chunk(i) for i in range(CHUNKS_PER_STREAM)]:
        raise RuntimeError(f"{target}: 127.0.0.1:{port}{PATH} answered {status} {str(values)[:300]}")
    found = {}
    for concurrency in CONCURRENCIES:
        samples = []
        for rep in range(run.reps):
            sample = await stream_measure(port, PATH, BODY, CHUNKS_PER_STREAM, concurrency, run.warmup_s, run.phase_s)
            print(
                f"  stream {target:<11} c={concurrency:<3} rep {rep + 1}: {sample.chunks_per_s:>8.0f} chunks/s "
                f"first chunk p50 {sample.p(0.5):.2f} ms p99 {sample.p(0.99):.2f} ms "
                f"errors {sample.errors} {sample.first_error}",
                flush=True,
            )
            samples.append(sample.to_json())
        found[concurrency] = StreamRow.of(samples)
    return found


@dataclass(frozen=True)
class SpacedRow:
    """Requests that each find the farm idle: a unary answer's p50 and a 200-chunk stream's first line's p50."""

    unary_p50_ms: Spread
    first_chunk_p50_ms: Spread
    count: int  # requests of each kind over all repetitions

    @property
    def difference_ms(self) -> float:
        return self.first_chunk_p50_ms.median - self.unary_p50_ms.median


async def timed_answer(conn: StreamConnection, request: bytes, first_line: bool) -> float | None:
    """Seconds from writing ``request`` to its stream's first line (``first_line``) or to its whole answer; None
    unless it was answered 200 (and, a stream, whole)."""
    started = time.perf_counter()
    answer = await conn.stream(request)
    took = time.perf_counter() - started
    if answer.status != 200 or (first_line and not answer.complete):
        return None
    return answer.first_line_s if first_line else took


async def measure_spaced(port: int, run: StreamRun) -> SpacedRow:
    """A unary call (examples.functions:noop) and a stream in turn, SPACED_GAP_S after each answer, on a keep-alive
    connection each (new ones per repetition: a gateway of an earlier commit closed idle ones after 5 s)."""
    unary_request = post_request(port, "/noop", orjson.dumps(NOOP_BODY))
    stream_request = post_request(port, PATH, BODY)
    unary_p50s, first_p50s = [], []
    for rep in range(run.reps):
        unary_conn, stream_conn = await StreamConnection.open(port), await StreamConnection.open(port)
        try:
            await unary_conn.stream(unary_request)
            await stream_conn.stream(stream_request)
            unary: list[float] = []
            first: list[float] = []
            for _ in range(run.spaced):
                for conn, request, first_line, times in (
                    (unary_conn, unary_request, False, unary),
                    (stream_conn, stream_request, True, first),
                ):
                    await asyncio.sleep(SPACED_GAP_S)
                    if (took := await timed_answer(conn, request, first_line)) is not None:
                        times.append(took)
        finally:
            unary_conn.close()
            stream_conn.close()
        unary_p50 = ms_percentiles(sorted(unary))[0] if unary else math.nan
        first_p50 = ms_percentiles(sorted(first))[0] if first else math.nan
        print(
            f"  spaced      {SPACED_GAP_S * 1000:g} ms apart rep {rep + 1}: unary p50 {unary_p50:.3f} ms, first chunk "
            f"p50 {first_p50:.3f} ms ({first_p50 - unary_p50:+.3f}), {run.spaced - len(unary)} + "
            f"{run.spaced - len(first)} failed",
            flush=True,
        )
        unary_p50s.append(unary_p50)
        first_p50s.append(first_p50)
    return SpacedRow(Spread.of(unary_p50s), Spread.of(first_p50s), run.spaced * run.reps)


async def measure_unary(port: int, run: StreamRun) -> Summary:
    """A unary call one at a time through the same gateway (examples.functions:noop)."""
    samples = []
    for rep in range(run.reps):
        sample = await http_measure(port, "/noop", orjson.dumps(NOOP_BODY), 1, run.warmup_s, run.phase_s, 1_000_000)
        print(f"  unary noop  c=1   rep {rep + 1}: p50 {sample.p(0.5):.3f} ms errors {sample.errors}", flush=True)
        samples.append(sample.to_json())
    return Summary.of(samples)


async def measure_ticks(target: str, port: int, run: StreamRun) -> dict[int, DelayRow]:
    """Each of TICK_LEVELS, by its number of streams."""
    return {streams: await measure_tick_level(target, port, run, streams) for streams in TICK_LEVELS}


async def measure_tick_level(target: str, port: int, run: StreamRun, streams: int) -> DelayRow:
    """``streams`` streams at TICK_PER_S: each line's delay from its yield to this client, in the window where all
    of them run."""
    p50s, p99s, rates, cores, late_p99s = [], [], [], [], []
    count = errors = 0
    first_error = ""
    for rep in range(run.reps):
        lines = await timed_streams(port, PATH, streams, TICK_PER_S, run.tick_ramp_s, run.tick_hold_s)
        start, end = lines.started + run.tick_ramp_s + SETTLE_S, lines.started + run.tick_hold_s
        window = lines.window(start, end)
        p50, p99 = ms_percentiles(window)
        _late_p50, late_p99 = ms_percentiles(lines.late_window(start, end))
        rate = len(window) / (end - start)
        print(
            f"  ticks  {target:<11} {streams} streams rep {rep + 1}: yield -> client p50 {p50:.2f} ms "
            f"p99 {p99:.2f} ms, due -> client p99 {late_p99:.2f} ms, {rate:.0f} chunks/s in the window, "
            f"client {lines.client_cores:.2f} cores, "
            f"errors {lines.errors} {lines.first_error}",
            flush=True,
        )
        p50s.append(p50)
        p99s.append(p99)
        rates.append(rate)
        cores.append(lines.client_cores)
        late_p99s.append(late_p99)
        count += len(window)
        errors += lines.errors
        first_error = first_error or lines.first_error
    return DelayRow(
        Spread.of(p50s),
        Spread.of(p99s),
        count,
        errors,
        first_error,
        Spread.of(rates),
        Spread.of(cores),
        Spread.of(late_p99s),
    )


async def disconnect_delays(
    port: int, redis_url: str, path: str, streaming: bool, count: int
) -> tuple[list[float], int]:
    """``count`` requests, one at a time, each running its handler, then its connection closed: the seconds from the
    close (this client's clock) to the handler's CancelledError (its clock), and how many were not cancelled in 5 s.
    A streaming request is closed after its first line; a unary one once its handler said it started."""
    redis = Redis.from_url(redis_url)
    token = uuid.uuid4().hex[:12]
    delays: list[float] = []
    missed = 0
    try:
        for k in range(count):
            started, cancelled = f"stream-bench:{token}:{k}:started", f"stream-bench:{token}:{k}:cancelled"
            request = post_request(port, path, orjson.dumps({"started": started, "cancelled": cancelled}))
            conn = await StreamConnection.open(port)
            try:
                if streaming:
                    answer = await asyncio.wait_for(conn.stream(request, first_only=True), 10)
                    running = answer.status == 200 and answer.lines >= 1
                else:
                    conn.writer.write(request)
                    running = await redis.blpop([started], timeout=10) is not None
            finally:
                closed_at = time.time()
                conn.close()
            seen = await redis.blpop([cancelled], timeout=5) if running else None
            if seen is None:
                missed += 1
            else:
                delays.append(float(seen[1]) - closed_at)
            await redis.delete(started, cancelled)
    finally:
        await redis.aclose()
    return delays, missed


async def measure_disconnects(port: int, redis_url: str, run: StreamRun) -> dict[str, DelayRow]:
    found = {}
    for kind, path in (("unary", "/cancel-unary"), ("generator", "/cancel-stream")):
        streaming = kind == "generator"
        await disconnect_delays(port, redis_url, path, streaming, 3)  # warm-up: connections, first calls
        p50s, p99s = [], []
        count = missed = 0
        for rep in range(run.reps):
            delays, not_cancelled = await disconnect_delays(port, redis_url, path, streaming, run.disconnects)
            p50, p99 = ms_percentiles(sorted(delays))
            print(
                f"  cancel {kind:<9} rep {rep + 1}: {len(delays)} disconnects: p50 {p50:.2f} ms p99 {p99:.2f} ms, "
                f"not cancelled {not_cancelled}",
                flush=True,
            )
            p50s.append(p50)
            p99s.append(p99)
            count += len(delays)
            missed += not_cancelled
        found[kind] = DelayRow(Spread.of(p50s), Spread.of(p99s), count, missed)
    return found
