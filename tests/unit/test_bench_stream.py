"""The stream bench's client parsing and its section's arithmetic (bench/stream_*.py); never a timing."""

from __future__ import annotations

import pytest

from bench.stats import Spread, Summary
from bench.stream_bench import Measured, section
from bench.stream_client import ChunkedBody, TimedLines
from bench.stream_phases import DelayRow, SpacedRow, StreamRow, StreamRun

# Two chunks (one with an extension), the last chunk and a trailer: RFC 9112's chunked framing.
CHUNKED = b"5\r\nhello\r\n3;x=1\r\n\nab\r\n0\r\nTrailer: 1\r\n\r\n"


@pytest.mark.parametrize("piece", [1, 2, 3, 7, len(CHUNKED)])
def test_chunked_body_in_any_pieces(piece: int) -> None:
    body = ChunkedBody()
    payload = b"".join(body.feed(CHUNKED[i : i + piece]) for i in range(0, len(CHUNKED), piece))
    assert payload == b"hello\nab" and body.done


def test_chunked_body_refuses_broken_framing() -> None:
    with pytest.raises(ValueError):
        ChunkedBody().feed(b"2\r\nabc\r\n")  # 3 bytes where the size said 2
    unfinished = ChunkedBody()
    assert unfinished.feed(b"2\r\nab\r\n") == b"ab" and not unfinished.done
    before_the_end = ChunkedBody()  # the body ends with the empty line after the trailers, not before
    assert before_the_end.feed(CHUNKED[:-2]) == b"hello\nab" and not before_the_end.done


def test_timed_lines_join_lines_cut_between_reads() -> None:
    lines = TimedLines()
    take = lines.reader()
    take(b'{"index":0,"t":10.0,"due":9.5}\n{"index":1,"t":1', 10.5)
    take(b'1.0,"due":10.0}\n', 11.25)
    assert lines.yielded == [10.0, 11.0] and lines.delays == [0.5, 0.25]
    assert lines.window(10.5, 12.0) == [0.25]
    # From when each was due: the first 1 s late, the second 1.25 s (its generator yielded it a second late).
    assert lines.late_window(9.0, 12.0) == [1.0, 1.25] and lines.late_window(9.75, 12.0) == [1.25]


def spread(value: float) -> Spread:
    return Spread.of([value])


def row(chunks_per_s: float, ttfc_p50_ms: float) -> StreamRow:
    return StreamRow(spread(chunks_per_s), spread(ttfc_p50_ms), spread(2 * ttfc_p50_ms), 0, "")


def test_section_states_each_goal_as_a_ratio_of_the_same_run() -> None:
    run = StreamRun(
        reps=1,
        warmup_s=1,
        phase_s=4,
        tick_ramp_s=1,
        tick_hold_s=6,
        disconnects=50,
        spaced=300,
        ray_python="/ray/python",
    )
    found = Measured(
        streams={
            "streamserve": {1: row(50_000, 0.9), 10: row(120_000, 4), 100: row(150_000, 50)},
            "bare": {1: row(150_000, 0.3), 10: row(160_000, 10), 100: row(170_000, 100)},
            "ray": {1: row(20_000, 10), 10: row(30_000, 60), 100: row(100_000, 400)},
        },
        unary=Summary(spread(0), spread(0.7), spread(1), 0),
        spaced=SpacedRow(spread(2.5), spread(3.25), 300),
        ticks={
            "streamserve": {1000: DelayRow(spread(5), spread(25), 1000, 0, "", spread(50_000), spread(0.3))},
            "bare": {1000: DelayRow(spread(1), spread(12), 1000, 0, "", spread(50_000), spread(0.5), spread(240))},
        },
        disconnects={
            "unary": DelayRow(spread(1), spread(8), 50, 0),
            "generator": DelayRow(spread(1), spread(9), 50, 2),
        },
        ray_note="ready: ray 2.60.0",
    )
    verdicts = section(found, run).verdicts
    assert "Chunks/s at 10 streams, streamserve / Ray Serve: **4.00x** (goal >= 1.5x: met)." in verdicts
    assert "Chunks/s at 100 streams, streamserve / Ray Serve: **1.50x** (goal >= 1.5x: met)." in verdicts
    assert "Chunks/s, streamserve / bare FastAPI: 0.33x at 1, 0.75x at 10, 0.88x at 100." in verdicts
    assert any("through the same gateway, back to back: **+0.20 ms** (goal <= +0.5 ms: met)" in v for v in verdicts)
    assert "First chunk p50 - unary p50, requests 20 ms apart: **+0.75 ms** (goal <= +0.5 ms: **missed**)." in verdicts
    assert any("streamserve / Ray Serve: **0.090** (goal < 0.1: met)" in v for v in verdicts)
    assert any(
        "yield -> client p99: **25.0 ms** (goal < 20 ms: **missed**). The bare FastAPI ceiling's p99 there: 12.0 ms, "
        "and from when a chunk was due: 240.0 ms." in v
        for v in verdicts
    )
    assert any("async unary handler, p99: **8.0 ms** (goal < 100 ms: met)" in v for v in verdicts)
    # A disconnect that never reached the handler fails the goal, whatever the others' timing.
    assert any("async generator handler, p99: **9.0 ms** (goal < 100 ms: **missed**); 2 not" in v for v in verdicts)


def test_without_ray_its_goals_are_not_judged() -> None:
    run = StreamRun(
        reps=1, warmup_s=1, phase_s=4, tick_ramp_s=1, tick_hold_s=6, disconnects=50, spaced=300, ray_python=""
    )
    found = Measured(streams={"streamserve": {1: row(50_000, 0.9), 10: row(1, 1), 100: row(1, 1)}})
    out = section(found, run)
    assert any("Ray Serve: skipped" in line for line in out.setup)
    assert "Chunks/s, streamserve / Ray Serve: n/a (Ray Serve skipped)." in out.verdicts
    assert not any("goal < 0.1" in v for v in out.verdicts)
