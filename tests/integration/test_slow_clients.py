"""Slowloris on a real gateway process held to 1024 open files (soft and hard, so that it cannot raise them): clients
that never finish their headers are closed at the header timeout and never starve real requests; with every
connection busy, one more gets 503 and the gateway carries on."""

from __future__ import annotations

import resource
import selectors
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from streamserve.app.http_protocol import ConnectionLimits
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from tests.harness.farm import kill_marked, marked_env
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for
from tests.integration.conftest import deploy

FD_LIMIT = 1024  # `ulimit -n 1024`, as in the report (issue 27)
HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 3.0
SLOW_CLIENTS = 1_100  # more than the gateway has files for
EARLY_S = 0.25  # how much sooner than its timeout a timer may fire (clocks, scheduling)


@dataclass(frozen=True)
class RunningGateway:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def assert_unharmed(self) -> None:
        assert self.proc.poll() is None, f"the gateway exited:\n{self.log.read_text()[-3000:]}"
        log = self.log.read_text()
        assert "Too many open files" not in log and "Traceback" not in log, log[-3000:]


def _lower_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _hold_enough_files_ourselves(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the test needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


@pytest.fixture(scope="module")
def gateway(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """``streamserve gateway`` under a limit of FD_LIMIT open files, with 3 s header and body timeouts."""
    _hold_enough_files_ourselves(4 * FD_LIMIT)
    token = uuid.uuid4().hex
    settings = {
        "REDIS_URL": redis_server.url,
        "STREAMSERVE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "STREAMSERVE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    port = free_port()
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [STREAMSERVE, "gateway", "--port", str(port)],
            cwd=ROOT,
            env=marked_env(token, settings),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_lower_fd_limit,
        )
    running = RunningGateway(port, proc, log)
    try:

        def ready_or_exited() -> bool:
            try:
                return httpx.get(running.url + "/-/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        wait_for(ready_or_exited, 30, lambda: f"the gateway did not start:\n{log.read_text()[-3000:]}")
        running.assert_unharmed()
        limits = Path(f"/proc/{proc.pid}/limits").read_text().splitlines()
        files = [line.split()[3:5] for line in limits if line.startswith("Max open files")]
        assert files == [[str(FD_LIMIT)] * 2], files  # soft and hard: the gateway could not raise them
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        kill_marked(token)


def _cap() -> int:
    """The connections the gateway holds at once under FD_LIMIT (STREAMSERVE_MAX_CONNECTIONS unset)."""
    return ConnectionLimits.for_process(Settings(), FD_LIMIT).max_connections


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


@dataclass
class Closed:
    """What a connection received before the gateway closed it, and when it closed."""

    answer: bytes
    at: float


def _read_until_closed(socks: list[socket.socket], within_s: float) -> dict[socket.socket, Closed]:
    """Everything each socket receives until the gateway closes it (end of stream, or reset); fails unless every
    one is closed within ``within_s``."""
    received = {sock: b"" for sock in socks}
    closed: dict[socket.socket, Closed] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)

        def all_closed() -> bool:
            for key, _ in selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    received[sock] += chunk
                else:
                    closed[sock] = Closed(received[sock], time.monotonic())
                    selector.unregister(sock)
            return not selector.get_map()

        wait_for(all_closed, within_s, lambda: f"{len(socks) - len(closed)} of {len(socks)} still open", interval_s=0)
    return closed


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a blocking socket; the connection stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), 0
    )
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail(f"closed after {data + body!r}")
    return head + b"\r\n\r\n" + body


def _ask(port: int, request: bytes) -> bytes:
    """Send ``request`` on a new connection; the whole answer, once the gateway has closed the connection."""
    with _connect(port) as sock:
        sock.sendall(request)
        return _read_until_closed([sock], within_s=5)[sock].answer


def test_slow_headers_neither_starve_real_requests_nor_stay_open(gateway: RunningGateway) -> None:
    slow: list[socket.socket] = []
    opened: dict[socket.socket, float] = {}
    try:
        for _ in range(SLOW_CLIENTS):
            sock = _connect(gateway.port)
            sock.sendall(b"GET /-/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")  # and nothing more
            slow.append(sock)
            opened[sock] = time.monotonic()
        for _ in range(20):  # real requests, each on a new connection, are served all along
            assert httpx.get(gateway.url + "/-/healthz", timeout=5).status_code == 200
        closed = _read_until_closed(slow, within_s=HEADER_TIMEOUT_S + 5)
    finally:
        for sock in slow:
            sock.close()
    # The oldest made room for newer ones (closed without a word), no more than the cap needed (fewer when opening
    # them all took longer than the header timeout); the others were answered at the header timeout, never sooner.
    silent = [sock for sock in slow if not closed[sock].answer]
    assert len(silent) <= SLOW_CLIENTS - _cap() + 40, f"{len(silent)} slow connections were closed without a word"
    timed_out = [sock for sock in slow if closed[sock].answer]
    for sock in timed_out:
        answer = closed[sock].answer
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"error":"HeaderTimeoutError"' in answer, answer[:300]
        assert closed[sock].at - opened[sock] >= HEADER_TIMEOUT_S - EARLY_S
    gateway.assert_unharmed()


def test_a_silent_connection_and_a_slow_later_request_are_closed_too(gateway: RunningGateway) -> None:
    with _connect(gateway.port) as kept, _connect(gateway.port) as silent:
        opened = time.monotonic()
        kept.sendall(b"GET /-/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_response(kept).startswith(b"HTTP/1.1 200 ")
        # A connection that never sends a byte is closed at the header timeout, without an answer. Waiting for it
        # also takes `kept` (idle, within uvicorn's 5 s keep-alive) past the timer its opening started.
        gone = _read_until_closed([silent], within_s=HEADER_TIMEOUT_S + 2)[silent]
        assert gone.answer == b"" and gone.at - opened >= HEADER_TIMEOUT_S - EARLY_S
        # A later request on the kept-alive connection has its own time for its headers, from its first byte.
        kept.sendall(b"GET /-/healthz HTTP/1.1\r\nHost: 127.")
        began = time.monotonic()
        late = _read_until_closed([kept], within_s=HEADER_TIMEOUT_S + 2)[kept]
    assert late.answer.startswith(b"HTTP/1.1 408 ") and b"header_timeout_s" in late.answer, late.answer[:300]
    assert late.at - began >= HEADER_TIMEOUT_S - EARLY_S
    gateway.assert_unharmed()


async def test_with_every_connection_busy_one_more_gets_503_until_they_end(
    gateway: RunningGateway, redis_server: EmbeddedRedis
) -> None:
    await deploy(Settings(redis_url=redis_server.url), route_prefix="/rec")
    routes = gateway.url + "/-/routes"
    wait_for(lambda: "/rec" in httpx.get(routes, timeout=5).json(), 10, "the gateway never saw /rec")
    busy: list[socket.socket] = []
    try:
        for _ in range(_cap()):  # each sends its headers, then a body that never comes
            sock = _connect(gateway.port)
            sock.sendall(
                b"POST /rec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 10\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            busy.append(sock)
        for sock in busy:  # the gateway has read each one's headers and waits for its body
            assert _read_response(sock).startswith(b"HTTP/1.1 100 ")
        for _ in range(10):
            refused = _ask(gateway.port, b"GET /-/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 503 "), refused[:300]
            assert b"retry-after: 1\r\n" in refused.lower() and b"connection: close\r\n" in refused.lower()
            assert b'"error":"OverloadedError"' in refused and b"max_connections" in refused
        ended = _read_until_closed(busy, within_s=BODY_TIMEOUT_S + 5)
    finally:
        for sock in busy:
            sock.close()
    assert all(b"HTTP/1.1 408 " in closed.answer for closed in ended.values())
    assert httpx.get(gateway.url + "/-/healthz", timeout=5).status_code == 200
    gateway.assert_unharmed()
