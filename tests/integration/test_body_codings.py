"""A body in a coding the gateway does not undo is refused, not read as if it were plain: a ``Content-Encoding`` other
than ``identity`` is 415 (a br body that happened to be JSON went to the handler; a gzip one was "not UTF-8"), a
``Transfer-Encoding`` other than ``chunked`` alone is 501 and the connection ends (``gzip, chunked`` was read as
chunked, the gzip ignored)."""

from __future__ import annotations

import asyncio
import gzip
import socket
from pathlib import Path

import orjson

from tests.harness.farm import gateway_process
from tests.integration.conftest import StartReplica

TOKEN = "body-codings-token-0123456789"
BODY = b'{"a":1}'
ZIPPED = gzip.compress(BODY)


def post(path: str, extra: bytes, body: bytes) -> bytes:
    return b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%b\r\n%b" % (
        path.encode(),
        extra,
        body,
    )


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


def ask(port: int, request: bytes) -> tuple[bytes, bytes, bool]:
    """Send ``request``; its answer's head and body, and whether the gateway closed the connection right after."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536) or b"<closed>"
            assert not data.endswith(b"<closed>"), data
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"content-length"))
        while len(body) < length:
            body += sock.recv(65536) or b"<closed>"
        sock.settimeout(1)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        return head, body, closed


async def test_bodies_in_codings_are_refused(start_replica: StartReplica, redis_url: str, tmp_path: Path) -> None:
    await start_replica(route_prefix="/rec")
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    with gateway_process(redis_url, tmp_path, STREAMSERVE_API_KEY=TOKEN) as port:
        plain = await asyncio.to_thread(
            ask, port, post("/rec", b"Content-Encoding: identity\r\nContent-Length: 7\r\n", BODY)
        )
        assert plain[0].startswith(b"HTTP/1.1 200 ") and orjson.loads(plain[1])["body"] == {"a": 1}, plain

        for coding, body in [(b"br", BODY), (b"gzip", ZIPPED)]:
            head, answer, closed = await asyncio.to_thread(
                ask, port, post("/rec", b"Content-Encoding: %b\r\nContent-Length: %d\r\n" % (coding, len(body)), body)
            )
            assert head.startswith(b"HTTP/1.1 415 "), (coding, head, answer)
            message = orjson.loads(answer)["message"]
            assert f"content coding '{coding.decode()}'" in message and "takes bodies unencoded" in message, message
            assert not closed  # the body was read whole: the connection serves on

        scale = post(
            "/-/deployments/rec/scale", auth + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n" % len(ZIPPED), ZIPPED
        )
        head, answer, _ = await asyncio.to_thread(ask, port, scale)
        assert head.startswith(b"HTTP/1.1 415 ") and "content coding 'gzip'" in orjson.loads(answer)["message"], answer

        for path in ("/rec", "/-/deployments/rec/scale"):
            request = post(path, auth + b"Transfer-Encoding: gzip, chunked\r\n", chunked(ZIPPED))
            head, answer, closed = await asyncio.to_thread(ask, port, request)
            assert head.startswith(b"HTTP/1.1 501 ") and b"\r\nconnection: close" in head, (path, head)
            assert "transfer coding 'gzip, chunked'" in orjson.loads(answer)["message"], answer
            assert closed, path
