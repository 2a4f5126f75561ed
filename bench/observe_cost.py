"""What metrics and the access log cost per request, in CPU: the gateway's ``RequestObserver.done`` (metrics off and
on, access log off and on, text format) and the replica's two metric calls, timed in-process over many calls.

Throughput on a shared 2-core machine moves by more than the few percent these cost (bench/observability_bench.py
takes the settings in turns and still cannot resolve them), so the cost is measured here directly and set beside
the CPU a whole request takes (bench/cpu_probe.py --http) for its share.

    .venv/bin/python -m bench.observe_cost [N]
"""

from __future__ import annotations

import asyncio
import io
import sys
import time

from streamserve.app.observe import RequestObserver
from streamserve.metrics.definitions import HANDLED, HANDLER_DURATION
from streamserve.metrics.figures import Figures
from streamserve.wire.messages import ReplyStatus

REQUEST_ID = "9f2c1e7a4b3d4c8e9a0b1c2d"


class _Discard(io.StringIO):
    def write(self, text: str) -> int:
        return len(text)


def gateway_us(n: int, metrics: bool, access_log: bool) -> float:
    """CPU microseconds of one ``done`` (its access line made and written with its batch's)."""
    observer = RequestObserver(Figures() if metrics else None, access_log)
    if observer._lines is not None:
        observer._lines._stream = _Discard()  # the lines are made and written, to nowhere (not this terminal)
    started = time.process_time()
    for _ in range(n):
        observer.done("POST", "/noop", 200, time.perf_counter(), REQUEST_ID, "noop", "noop#5f2a9c1e", "default")
    observer.flush()
    return (time.process_time() - started) / n * 1e6


def replica_us(n: int) -> float:
    """CPU microseconds of the replica's metrics for one request (handler duration, outcome)."""
    figures = Figures()
    started = time.process_time()
    for _ in range(n):
        figures.observe("noop", HANDLER_DURATION, 0.0001)
        figures.count("noop", HANDLED, ReplyStatus.OK.value)
    return (time.process_time() - started) / n * 1e6


async def main(n: int) -> None:
    base = gateway_us(n, False, False)
    metrics = gateway_us(n, True, False)
    both = gateway_us(n, True, True)
    print(
        f"gateway, per request: both off {base:.2f} us, metrics {metrics - base:+.2f} us, "
        f"access log {both - metrics:+.2f} us"
    )
    print(f"replica, per request: metrics {replica_us(n):.2f} us")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000))
