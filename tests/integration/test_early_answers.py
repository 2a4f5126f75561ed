"""An answer given before the request's body was all read (an unknown route, a body too large by its Content-Length, a
refused admin write) ends the connection: it says ``connection: close`` and the gateway reads no more of the body.
uvicorn read the rest and threw it away, as long as the client kept sending: a byte every 50 s held the connection
past the body timeout and the keep-alive, and a 413 to ``Content-Length: 999999999`` waited for all of it."""

from __future__ import annotations

import socket
from pathlib import Path

from streamserve.runtime.settings import Settings
from tests.harness.farm import gateway_process
from tests.integration.conftest import deploy

TOKEN = "early-answers-token-0123456789"
# Each: a request whose head and first part of its body are sent, the rest never; the status it gets at once.
UNFINISHED = [
    (b"POST /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{", 404),
    (b"POST /rec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 999999999\r\n\r\n" + b" " * 1024, 413),
    (b"POST /-/deployments/rec/scale HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{", 401),
    (
        b"POST /-/deployments/rec/scale HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 1000\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n{",
        403,
    ),
]


def read_until_closed(sock: socket.socket) -> bytes:
    """All the gateway sends until it closes the connection; a socket timeout (5 s, far below the body timeout and
    the keep-alive) fails the test: the connection was held."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"the connection was still open 5 s after {data[:300]!r}") from None
    except ConnectionResetError:
        raise AssertionError(f"the connection was reset after {data[:300]!r}") from None
    return data


async def test_an_answer_before_the_body_is_read_ends_the_connection(
    settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    await deploy(settings)  # a route at /rec, for the 413
    with gateway_process(redis_url, tmp_path, STREAMSERVE_API_KEY=TOKEN) as port:
        for request, status in UNFINISHED:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(request)
                answer = read_until_closed(sock)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 %d " % status), (request[:60], answer[:300])
            assert b"\r\nconnection: close" in head.lower(), (request[:60], head)
            assert body.startswith(b'{"error":'), (request[:60], answer[:300])


async def test_an_error_to_a_request_whose_body_came_whole_keeps_the_connection(redis_url: str, tmp_path: Path) -> None:
    with (
        gateway_process(redis_url, tmp_path) as port,
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
    ):
        sock.sendall(b"POST /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\n\r\n{" * 2)
        data = b""
        while data.count(b"HTTP/1.1 404 ") < 2 or not data.endswith(b"}"):
            data += sock.recv(65536) or b"<closed>"
            assert not data.endswith(b"<closed>"), data
    assert b"connection: close" not in data.lower(), data
