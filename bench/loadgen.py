"""Closed-loop load generators: HTTP/1.1 on raw asyncio streams, any coroutine, any blocking call in threads.

Closed loop: each of ``concurrency`` workers sends its next request when the previous answer arrived.
Every phase is bounded twice, by a deadline and by a request count; a phase that has not ended
``PHASE_GRACE_S`` after its deadline is cancelled and what was in flight counts as errors.

The HTTP ``Connection`` costs roughly 50-100 us of CPU per request, less than the cheapest server
measured, which matters on a 2-core machine where the load generator shares the CPU with the servers.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.children import HOST
from bench.stats import Sample

PHASE_GRACE_S = 10.0
# The payload of every noop request, on every path and every system compared.
NOOP_BODY: dict[str, Any] = {"x": [1, 2, 3], "s": "hello"}


# -- HTTP --------------------------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a fixed request and reads Content-Length responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, bytes, bool]:
        """Write the request, return (status, body, server wants to close)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = -1
        close = False
        for line in head[:-4].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if length < 0:
            raise ValueError("response without Content-Length")
        return status, await self.reader.readexactly(length), close

    def close(self) -> None:
        self.writer.close()


def post_request(port: int, path: str, body: bytes, headers: str = "") -> bytes:
    """A POST of ``body``; ``headers``: more header lines, each ending in CRLF."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def keyed_requests(port: int, path: str, body: bytes) -> Callable[[], bytes]:
    """POSTs of ``body``, each with an ``Idempotency-Key`` of its own (every one runs: a key's cost, not a replay)."""
    prefix = f"{time.time_ns():x}-"
    count = itertools.count()
    return lambda: post_request(port, path, body, f"Idempotency-Key: {prefix}{next(count)}\r\n")


_NETWORK_ERRORS = (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


async def http_probe(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, body)."""
    conn = await Connection.open(port)
    try:
        status, answer, _ = await asyncio.wait_for(conn.send(post_request(port, path, body)), 30)
    finally:
        conn.close()
    return status, answer


async def http_phase(
    port: int,
    path: str,
    body: bytes,
    conns: list[Connection | None],
    seconds: float,
    max_requests: int,
    requests: Callable[[], bytes] | None = None,
) -> Sample:
    """One timed phase on ``len(conns)`` keep-alive connections (reopened when a server closes one); ``requests``
    makes each request (by default all are one POST of ``body`` to ``path``)."""
    request = post_request(port, path, body)
    sample = Sample()
    started = 0
    perf = time.perf_counter
    deadline = perf() + seconds

    async def worker(i: int) -> None:
        nonlocal started
        while started < max_requests and perf() < deadline:
            started += 1
            conn = conns[i]
            try:
                if conn is None:
                    conn = conns[i] = await Connection.open(port)
                t0 = perf()
                status, _answer, close = await conn.send(request if requests is None else requests())
                elapsed = perf() - t0
            except _NETWORK_ERRORS as exc:
                sample.error(exc)
                if conn is not None:
                    conn.close()
                conns[i] = None
                await asyncio.sleep(0.01)  # the server is gone or broken: do not spin
                continue
            if status == 200:
                sample.ok += 1
                sample.latencies.append(elapsed)
            else:
                sample.errors += 1
            if close:
                conn.close()
                conns[i] = None

    sample.seconds = await run_workers([worker(i) for i in range(len(conns))], seconds, sample, lambda: started)
    return sample


async def http_measure(
    port: int,
    path: str,
    body: bytes,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    max_requests: int,
    requests: Callable[[], bytes] | None = None,
) -> Sample:
    """Warm up, then measure, on the same ``concurrency`` keep-alive connections (``requests``: as http_phase's)."""
    conns: list[Connection | None] = [None] * concurrency
    try:
        await http_phase(port, path, body, conns, warmup_s, max_requests, requests)
        return await http_phase(port, path, body, conns, duration_s, max_requests, requests)
    finally:
        for conn in conns:
            if conn is not None:
                conn.close()


# -- any coroutine -----------------------------------------------------------------------------------------


async def run_workers(
    coros: list[Awaitable[None]], seconds: float, sample: Sample, started: Callable[[], int]
) -> float:
    """Run the workers of one phase to their end (or cancel them after the grace); the elapsed seconds."""
    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        _done, stuck = await asyncio.wait(tasks, timeout=seconds + PHASE_GRACE_S)
        elapsed = time.perf_counter() - t0
    finally:  # also on Ctrl-C, which cancels us
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if stuck:
        sample.errors += started() - sample.ok - sample.errors  # what was still in flight
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise RuntimeError("load worker failed") from task.exception()
    return elapsed


async def async_phase(
    call: Callable[[], Awaitable[object]], concurrency: int, seconds: float, max_requests: int
) -> Sample:
    """``concurrency`` tasks each awaiting ``call()`` in turn for ``seconds``; any exception is an error."""
    sample = Sample()
    started = 0
    perf = time.perf_counter
    deadline = perf() + seconds

    async def worker() -> None:
        nonlocal started
        while started < max_requests and perf() < deadline:
            started += 1
            t0 = perf()
            try:
                await call()
            except Exception as exc:
                sample.error(exc)
                await asyncio.sleep(0.01)
                continue
            sample.latencies.append(perf() - t0)
            sample.ok += 1

    sample.seconds = await run_workers([worker() for _ in range(concurrency)], seconds, sample, lambda: started)
    return sample


# -- any blocking call, in threads -------------------------------------------------------------------------


def thread_phase(call: Callable[[], object], concurrency: int, seconds: float, max_requests: int) -> Sample:
    """``concurrency`` threads each running ``call()`` in turn for ``seconds``; any exception is an error.

    For clients with a blocking API (Celery's ``delay().get()``, RQ). A thread still blocked after the
    grace is abandoned (daemon) and its request counted as an error; calls must carry their own timeout.
    """
    sample = Sample()
    lock = threading.Lock()
    started = 0
    perf = time.perf_counter
    deadline = perf() + seconds

    def worker() -> None:
        nonlocal started
        while perf() < deadline:
            with lock:
                if started >= max_requests:
                    return
                started += 1
            t0 = perf()
            try:
                call()
            except Exception as exc:
                with lock:
                    sample.error(exc)
                time.sleep(0.01)
                continue
            elapsed = perf() - t0
            with lock:
                sample.latencies.append(elapsed)
                sample.ok += 1

    threads = [threading.Thread(target=worker, daemon=True, name=f"load-{i}") for i in range(concurrency)]
    t0 = perf()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, t0 + seconds + PHASE_GRACE_S - perf()))
    sample.seconds = perf() - t0
    with lock:
        stuck = sum(t.is_alive() for t in threads)
        sample.errors += stuck
    return sample
