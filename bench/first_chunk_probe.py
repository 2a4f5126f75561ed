"""A stream's first chunk against a unary answer through one gateway, on the stream bench's farm: in blocks of one
kind back to back (as the stream bench's 1-stream phase measures the first chunk), and spaced, each request
``gap`` after the last answer (each finds the farm idle). Run against the code checked out; alternate checkouts to
compare a change.

    .venv/bin/python -m bench.first_chunk_probe [REPS] [GAPS_MS]     # e.g. 3 0,5,20

Each line: per gap, the unary p50, the 200-chunk stream's first-line p50 and their difference (ms).
"""

from __future__ import annotations

import asyncio
import statistics
import sys

import orjson
import uvloop

from bench.children import Children
from bench.farm import start_farm
from bench.loadgen import NOOP_BODY, post_request
from bench.stream_bench import farm_config
from bench.stream_chunks import CHUNKS_PER_STREAM
from bench.stream_client import StreamConnection
from bench.stream_phases import PATH, REPLICAS, timed_answer

REQUESTS = 400  # of each kind, per gap and repetition
WARM_UP = 300


async def block(port: int, request: bytes, gap_s: float, first_line: bool) -> float:
    """The p50 in ms of REQUESTS requests on a fresh keep-alive connection, each ``gap_s`` after the last answer:
    to the first line of a stream, or to the whole unary answer."""
    conn = await StreamConnection.open(port)  # fresh: a gateway of an earlier commit closed idle ones after 5 s
    try:
        await conn.stream(request)
        took = []
        for _ in range(REQUESTS):
            if gap_s:
                await asyncio.sleep(gap_s)
            seconds = await timed_answer(conn, request, first_line)
            if seconds is None:
                raise RuntimeError(f"127.0.0.1:{port}: a request was not answered 200 (whole)")
            took.append(seconds)
        return 1000 * statistics.median(took)
    finally:
        conn.close()


async def probe(port: int, reps: int, gaps_s: list[float]) -> None:
    unary = post_request(port, "/noop", orjson.dumps(NOOP_BODY))
    stream = post_request(port, PATH, orjson.dumps({"n": CHUNKS_PER_STREAM}))
    await block(port, unary, 0, False)
    for _ in range(WARM_UP // REQUESTS + 1):
        await block(port, stream, 0, True)
    for rep in range(reps):
        line = f"rep {rep + 1}:"
        for gap_s in gaps_s:
            unary_ms = await block(port, unary, gap_s, False)
            first_ms = await block(port, stream, gap_s, True)
            line += f"  gap {gap_s * 1000:g} ms: unary {unary_ms:.3f} first {first_ms:.3f} ({first_ms - unary_ms:+.3f})"
        print(line, flush=True)


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 3
    gaps_s = [float(gap) / 1000 for gap in argv[1].split(",")] if len(argv) > 1 else [0.0, 0.02]
    with Children() as children:
        farm = start_farm(children, farm_config(REPLICAS))
        uvloop.run(probe(farm.port, reps, gaps_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
