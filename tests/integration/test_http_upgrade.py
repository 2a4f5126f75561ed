"""A request that asks to upgrade the connection (curl --http2 sends "Upgrade: h2c"): uvicorn takes no such upgrade
and hands over no body, so the handler ran on null; the gateway now answers 400 saying why."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import orjson

from tests.harness.farm import gateway_process
from tests.integration.conftest import StartReplica

H2C = (
    b"POST /rec HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n"
    b'{"a":1}'
)


def ask(port: int, request: bytes) -> bytes:
    """Send ``request`` and read one response (head and Content-Length body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536) or b"!"
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(v)
            for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
        while len(body) < length:
            body += sock.recv(65536)
        return head + b"\r\n\r\n" + body


async def test_a_body_lost_to_an_upgrade_is_a_400_never_a_call_on_null(
    start_replica: StartReplica, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path) as port:
        answer = await asyncio.to_thread(ask, port, H2C)
        plain = await asyncio.to_thread(ask, port, H2C.replace(b"Upgrade: h2c\r\n", b"").replace(b"Upgrade, ", b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert "loses its body: send plain HTTP/1.1" in orjson.loads(body)["message"]
    assert plain.startswith(b"HTTP/1.1 200 ") and orjson.loads(plain.partition(b"\r\n\r\n")[2])["body"] == {"a": 1}


def test_a_request_behind_an_upgrade_request_is_answered(redis_url: str, tmp_path: Path) -> None:
    """RFC 9110, 7.8: a server that ignores Upgrade goes on speaking HTTP/1.1. A request sent in the same write behind
    one that asked to Upgrade was dropped (httptools stops at the upgrade request's end), never answered."""
    upgrade = b"GET /-/healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    behind = b"GET /-/routes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with gateway_process(redis_url, tmp_path) as port, socket.create_connection(("127.0.0.1", port), 10) as sock:
        sock.sendall(upgrade + behind)
        data = b""
        while chunk := sock.recv(65536):  # (to the close that the second asked for)
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 2, data
