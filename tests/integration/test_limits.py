"""Limits on what a client controls: slow bodies, oversized headers, oversized results."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import RemoteError
from tests.harness.farm import gateway_process
from tests.harness.waiting import wait_for
from tests.integration.conftest import StartReplica, deploy


async def test_a_result_above_max_response_bytes_is_a_500_and_never_reaches_redis(
    start_replica: StartReplica, client: AsyncClient, http: httpx.AsyncClient, redis_url: str
) -> None:
    await start_replica(route_prefix="/rec", max_response_bytes=2_000)
    assert (await client.call("rec", "x" * 100))["body"] == "x" * 100
    with pytest.raises(RemoteError) as refused:
        await client.call("rec", "y" * 5_000)
    assert refused.value.error_type == "ResponseTooLargeError"
    assert "above max_response_bytes (2000)" in refused.value.message
    over_http = await http.post("/rec", json="z" * 5_000)
    assert over_http.status_code == 500 and over_http.json()["error"] == "ResponseTooLargeError"
    # The replies that went to Redis are the error, never the large value.
    conn = redis.Redis.from_url(redis_url)
    try:
        for key in conn.scan_iter(match="streamserve:replies:*"):
            assert all(len(b"".join(fields.values())) < 2_000 for _id, fields in conn.xrange(key))
    finally:
        conn.close()


async def test_batch_outputs_are_bounded_too(start_replica: StartReplica, client: AsyncClient) -> None:
    await start_replica(name="batched", import_path="tests.deployments:batched_fn", max_response_bytes=500)
    assert (await client.call("batched", 1))["in"] == 1
    with pytest.raises(RemoteError, match="above max_response_bytes"):
        await client.call("batched", "b" * 1_000)


TOKEN = "limits-test-token"


@pytest.fixture
def gateway(redis_url: str, tmp_path: Path) -> Iterator[int]:
    """A real gateway process (uvicorn decides what happens to the connection) with a 1 s body timeout."""
    with gateway_process(
        redis_url,
        tmp_path,
        STREAMSERVE_BODY_TIMEOUT_S="1",
        STREAMSERVE_MAX_HEADER_BYTES="8192",
        STREAMSERVE_API_KEY=TOKEN,
    ) as port:
        yield port


def _read_all(sock: socket.socket, deadline_s: float) -> bytes:
    sock.settimeout(deadline_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data  # the server closed the connection


@pytest.mark.parametrize("path", ["/rec", "/-/deploy"])
async def test_a_body_that_trickles_gets_408_and_its_connection_closed(
    gateway: int, settings: Settings, path: str
) -> None:
    await deploy(settings, route_prefix="/rec")
    routes = f"http://127.0.0.1:{gateway}/-/routes"
    wait_for(lambda: "/rec" in httpx.get(routes, timeout=5).json(), 10, "the gateway never saw /rec")
    with socket.create_connection(("127.0.0.1", gateway), timeout=10) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n"
        sock.sendall(f"{head}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n".encode())
        started = time.monotonic()
        answer = _read_all(sock, 10)  # we send nothing more: the gateway must not wait for us
    assert time.monotonic() - started < 5
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"BodyTimeoutError" in answer and b"body_timeout_s" in answer


def test_oversized_headers_get_431(gateway: int) -> None:
    small = httpx.post(f"http://127.0.0.1:{gateway}/nothing", json=1, headers={"X-Pad": "a" * 1_000})
    assert small.status_code == 404
    big = httpx.post(f"http://127.0.0.1:{gateway}/nothing", json=1, headers={"X-Pad": "a" * 20_000})
    assert big.status_code == 431 and big.json()["error"] == "HeadersTooLargeError"
    assert httpx.get(f"http://127.0.0.1:{gateway}/-/status", headers={"X-Pad": "a" * 20_000}).status_code == 431


def test_oversized_headers_get_431_and_their_connection_closed(gateway: int) -> None:
    """The client gets no further request on that connection: the gateway closes it after the answer, at once (not
    at the end of uvicorn's keep-alive, 5 s)."""
    request = f"GET /-/status HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * 20_000}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", gateway), timeout=10) as sock:
        sock.sendall(request)
        answer = _read_until_closed(sock, within_s=2)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"HeadersTooLargeError" in answer


def test_a_url_past_what_the_parser_takes_gets_414_and_a_head_past_the_limit_431(
    redis_url: str, tmp_path: Path
) -> None:
    """httptools parses URLs of up to 65,535 bytes: a longer one is 414 saying so (it was a 400 about malformed
    HTTP). A head still coming past the limit (4 x max_header_bytes, 256 KiB by default) is 431 at once: the first
    read of a request was not counted, and a URL of 280-340 KB that never ended got 408 at the header timeout."""
    with gateway_process(redis_url, tmp_path) as port:
        for length, end, status in ((60_000, True, b"200"), (70_000, True, b"414"), (300_000, False, b"431")):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                head = f"GET /-/healthz?{'a' * length}" + (" HTTP/1.1\r\nHost: x\r\n\r\n" if end else "")
                sock.sendall(head.encode())
                answer = _read_until_closed(sock, within_s=5) if status != b"200" else sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 " + status), (length, answer[:300])
            if status == b"414":
                assert b"URITooLongError" in answer and b"passed 65535 bytes" in answer, answer


def _read_until_closed(sock: socket.socket, within_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it has not closed within ``within_s``."""
    deadline = time.monotonic() + within_s
    data = b""
    while True:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"the connection was still open {within_s} s later, after {data[:100]!r}") from None
        if not chunk:
            return data
        data += chunk


def test_options_star_gets_the_error_shape(gateway: int) -> None:
    """A request-target of ``*`` matches no route; the answer is still ``{"error", "message"}``."""
    with socket.create_connection(("127.0.0.1", gateway), timeout=10) as sock:
        sock.sendall(b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read_all(sock, 10)
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
    assert b'"error":"NotFoundError"' in answer and b'"detail"' not in answer


@pytest.mark.parametrize("upgrade", ["websocket", "h2c"])
def test_a_request_asking_to_switch_protocols_is_answered_as_http_at_once(gateway: int, upgrade: str) -> None:
    """The gateway serves no WebSocket and no HTTP/2: asked to switch, it answers the request as HTTP/1.1, in the
    gateway's error shape, and never holds the connection (a POST with a body and `Upgrade: websocket` was handed to
    uvicorn's WebSocket protocol and hung for good: one slot of max_connections per such request)."""
    asks = f"Connection: Upgrade\r\nUpgrade: {upgrade}\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    for request in (
        f"POST /nothing HTTP/1.1\r\nHost: x\r\n{asks}Content-Type: application/json\r\nContent-Length: 7\r\n\r\n"
        '{"a":1}',
        f"GET /nothing HTTP/1.1\r\nHost: x\r\n{asks}\r\n",
    ):
        with socket.create_connection(("127.0.0.1", gateway), timeout=3) as sock:
            sock.sendall(request.encode())
            answer = b""
            while not answer.endswith(b"}"):  # the whole JSON error body, within the socket's timeout
                answer += sock.recv(65536)
        assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 404 ")), answer[:300]
        assert b'"error":"' in answer and b"application/json" in answer, answer[:300]
