"""Streamed HTTP/1.1 answers on raw asyncio streams: one POST, its chunked body read as NDJSON lines as they come.

The load generators of bench/stream_bench.py:

- ``stream_measure``: a closed loop of streams on keep-alive connections (each connection sends its next POST when
  the previous stream ended): lines (chunks) per second, and per stream the time from writing the request to the
  arrival of its first whole line;
- ``timed_streams``: many concurrent streams started evenly over a ramp, each line of which carries the server's
  wall clock at its ``yield``; the time it arrived here less that, per line.

The body is read in blocks of up to READ_BYTES and its chunked framing taken apart in one pass over each block
(``ChunkedBody``), so that the client's cost is per read, not per HTTP chunk: the bare app sends each NDJSON line
as an HTTP chunk of its own, streamserve's gateway what one read of its reply stream brought.
"""

from __future__ import annotations

import asyncio
import math
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.children import HOST
from bench.loadgen import PHASE_GRACE_S, post_request, run_workers
from bench.stats import Sample, percentile

READ_BYTES = 256 * 1024

# What a stream's lines are handed to, with the wall clock (time.time()) of the read that brought them.
OnLines = Callable[[bytes, float], None]


class ChunkedBody:
    """The payload of an HTTP/1.1 chunked body (RFC 9112, 7.1), from its bytes in whatever pieces they come."""

    def __init__(self) -> None:
        self._rest = b""  # an incomplete size line or CRLF, carried to the next piece
        self._left = 0  # bytes of the current chunk's data still to come
        self._data_ended = False  # the CRLF after a chunk's data is due
        self._trailer = False  # the last chunk came: trailer lines until an empty one
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The payload in ``data`` (empty when it holds none); ``done`` once the body's end came. Raises ValueError on
        broken framing."""
        buf = self._rest + data if self._rest else data
        out = []
        pos, end = 0, len(buf)
        while pos < end and not self.done:
            if self._left:
                take = min(self._left, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line, pos = buf[pos:eol], eol + 2
            if self._data_ended:
                if line:
                    raise ValueError(f"chunk data not followed by CRLF: {line[:40]!r}")
                self._data_ended = False
            elif self._trailer:
                self.done = not line
            else:
                size = int(line.split(b";", 1)[0], 16)
                if size:
                    self._left, self._data_ended = size, True
                else:
                    self._trailer = True
        self._rest = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)


@dataclass
class StreamAnswer:
    """One streamed answer as the client saw it."""

    status: int
    lines: int = 0
    first_line_s: float = math.nan  # from writing the request to the first whole line
    complete: bool = False  # the body ended as a chunked body ends (else the server cut it)
    close: bool = False  # the server asked to close the connection
    body: bytes = b""  # an answer that is not chunked (an error)


class StreamConnection:
    """One keep-alive HTTP/1.1 connection that sends a POST and reads its streamed answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> StreamConnection:
        reader, writer = await asyncio.open_connection(HOST, port, limit=READ_BYTES)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def stream(self, request: bytes, on_lines: OnLines | None = None, first_only: bool = False) -> StreamAnswer:
        """Write ``request``, read its answer; ``on_lines`` gets the payload of each read (whole lines or not).
        ``first_only``: return once the first whole line came, leaving the rest unread."""
        perf = time.perf_counter
        t0 = perf()
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        answer, chunked, length = _parse_head(head)
        if not chunked:
            answer.body = await (self.reader.readexactly(length) if length >= 0 else self.reader.read())
            answer.lines = answer.body.count(b"\n")
            return answer
        body = ChunkedBody()
        while not body.done:
            data = await self.reader.read(READ_BYTES)
            if not data:
                return answer  # cut: not complete
            payload = body.feed(data)
            if not payload:
                continue
            lines = payload.count(b"\n")
            if lines and not answer.lines:
                answer.first_line_s = perf() - t0
                if first_only:
                    answer.lines = lines
                    return answer
            answer.lines += lines
            if on_lines is not None:
                on_lines(payload, time.time())
        answer.complete = True
        return answer

    def close(self) -> None:
        self.writer.close()


def _parse_head(head: bytes) -> tuple[StreamAnswer, bool, int]:
    """The status line and headers: (the answer so far, whether the body is chunked, its Content-Length or -1)."""
    answer = StreamAnswer(int(head[9:12]))
    chunked, length = False, -1
    for line in head[:-4].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"content-length":
            length = int(value)
        elif name == b"connection":
            answer.close = value == b"close"
    return answer, chunked, length


_NETWORK_ERRORS = (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


# -- a closed loop of streams ---------------------------------------------------------------------------------


@dataclass
class StreamSample(Sample):
    """One measured phase of streams: ``ok`` streams, ``chunks`` lines in them, ``latencies`` their first lines."""

    chunks: int = 0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "chunks": self.chunks, "chunks_per_s": self.chunks_per_s}


async def stream_phase(
    port: int, request: bytes, expected: int, conns: list[StreamConnection | None], seconds: float, max_streams: int
) -> StreamSample:
    """One timed phase on ``len(conns)`` keep-alive connections; a stream counts when it is a 200 that ended well with
    ``expected`` lines, and the phase lasts until the streams begun before its deadline have ended."""
    sample = StreamSample()
    started = 0
    perf = time.perf_counter
    deadline = perf() + seconds

    async def worker(i: int) -> None:
        nonlocal started
        while started < max_streams and perf() < deadline:
            started += 1
            conn = conns[i]
            try:
                if conn is None:
                    conn = conns[i] = await StreamConnection.open(port)
                answer = await conn.stream(request)
            except _NETWORK_ERRORS as exc:
                sample.error(exc)
                if conn is not None:
                    conn.close()
                conns[i] = None
                await asyncio.sleep(0.01)  # the server is gone or broken: do not spin
                continue
            if answer.status == 200 and answer.complete and answer.lines == expected:
                sample.ok += 1
                sample.chunks += answer.lines
                sample.latencies.append(answer.first_line_s)
            else:
                sample.error(ValueError(f"status {answer.status}, {answer.lines} lines, complete {answer.complete}"))
            if answer.close or not answer.complete:
                conn.close()
                conns[i] = None

    sample.seconds = await run_workers([worker(i) for i in range(len(conns))], seconds, sample, lambda: started)
    return sample


async def stream_measure(
    port: int, path: str, body: bytes, expected: int, concurrency: int, warmup_s: float, duration_s: float
) -> StreamSample:
    """Warm up, then measure, on the same ``concurrency`` keep-alive connections."""
    request = post_request(port, path, body)
    conns: list[StreamConnection | None] = [None] * concurrency
    max_streams = 10_000_000  # bounded by the deadline: a stream is hundreds of lines
    try:
        await stream_phase(port, request, expected, conns, warmup_s, max_streams)
        return await stream_phase(port, request, expected, conns, duration_s, max_streams)
    finally:
        for conn in conns:
            if conn is not None:
                conn.close()


async def stream_probe(port: int, path: str, body: bytes) -> tuple[int, list[Any]]:
    """One stream on a fresh connection: its status and its lines, decoded."""
    conn = await StreamConnection.open(port)
    got: list[bytes] = []
    try:
        answer = await asyncio.wait_for(
            conn.stream(post_request(port, path, body), lambda data, _t: got.append(data)), 30
        )
    finally:
        conn.close()
    if answer.status != 200 or not answer.complete:
        return answer.status, [answer.body[:300]]
    return answer.status, [orjson.loads(line) for line in b"".join(got).splitlines()]


# -- timed streams ---------------------------------------------------------------------------------------------


@dataclass
class TimedLines:
    """Every line of the timed streams: when the server yielded it (``t``, its wall clock), how long it took to
    arrive here, and how long after it was due (``due``: its schedule's time) it arrived."""

    yielded: list[float] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    due: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    streams: int = 0
    errors: int = 0
    first_error: str = ""
    started: float = 0.0  # wall clock when the first stream was started
    client_cores: float = math.nan  # the CPU this process used while the streams ran, in cores

    def error(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why[:300]

    def reader(self) -> OnLines:
        """What one stream hands its payload to: whole lines are noted, a partial one waits for its end."""
        carry = b""

        def take(data: bytes, now: float) -> None:
            nonlocal carry
            *lines, carry = (carry + data).split(b"\n") if carry else data.split(b"\n")
            for line in lines:
                value = orjson.loads(line)
                t, due = value["t"], value["due"]
                self.yielded.append(t)
                self.delays.append(now - t)
                self.due.append(due)
                self.lateness.append(now - due)

        return take

    def window(self, start: float, end: float) -> list[float]:
        """The delays of the lines yielded in [start, end) (wall clock), ascending."""
        return sorted(d for t, d in zip(self.yielded, self.delays, strict=True) if start <= t < end)

    def late_window(self, start: float, end: float) -> list[float]:
        """How late the lines due in [start, end) (wall clock) arrived after they were due, ascending."""
        return sorted(late for due, late in zip(self.due, self.lateness, strict=True) if start <= due < end)


async def timed_streams(port: int, path: str, streams: int, per_s: float, ramp_s: float, hold_s: float) -> TimedLines:
    """``streams`` streams of ``hold_s`` seconds of lines at ``per_s``, each on its own connection, started evenly
    over ``ramp_s``; all run at once from ``ramp_s`` to ``hold_s`` after the first began."""
    found = TimedLines()
    expected = round(hold_s * per_s)
    request = post_request(port, path, orjson.dumps({"n": expected, "per_s": per_s}))
    t0 = time.monotonic()

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + i * ramp_s / streams - time.monotonic()))
        try:
            conn = await StreamConnection.open(port)
        except OSError as exc:
            found.error(f"connect: {exc!r}")
            return
        try:
            answer = await conn.stream(request, found.reader())
        except _NETWORK_ERRORS as exc:
            found.error(repr(exc))
            return
        finally:
            conn.close()
        if answer.status == 200 and answer.complete and answer.lines == expected:
            found.streams += 1
        else:
            found.error(f"status {answer.status}, {answer.lines} of {expected} lines, complete {answer.complete}")

    found.started = time.time()
    cpu0 = _own_cpu_s()
    tasks = [asyncio.ensure_future(one(i)) for i in range(streams)]
    try:
        _done, stuck = await asyncio.wait(tasks, timeout=ramp_s + hold_s + PHASE_GRACE_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    found.client_cores = (_own_cpu_s() - cpu0) / (time.time() - found.started)
    for _ in stuck:
        found.error("still running past the deadline")
    return found


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def ms_percentiles(sorted_seconds: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds of an ascending list of seconds."""
    return 1000 * percentile(sorted_seconds, 0.5), 1000 * percentile(sorted_seconds, 0.99)
