"""A caller cannot forge a line of the gateway's text access log, nor reach the terminal that shows it: control
characters in the path or the X-Request-ID are written as visible escapes (wire.printable), a path's spaces as %20
(they would forge the fields after it), and on ``/-/`` paths an
X-Request-ID that is not a valid id (spaces) is not logged, as on deployment paths."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from tests.harness.farm import gateway_process
from tests.harness.waiting import wait_for
from tests.integration.conftest import StartReplica
from tests.integration.test_access_log import access_lines

# A newline and what would follow it as a line of its own.
FORGING_PATH = "/-/x%0aFORGED%20POST%20/-/deploy%20200"
# A screen clear, an OSC 52 clipboard write (BEL-terminated), a carriage return and C1 CSI (U+009B, as UTF-8).
TERMINAL_PATH = "/-/y%1b[2J%1b]52;c;aGk=%07%0d%C2%9B31m"


def _raw_get(port: int, target: bytes, headers: bytes) -> bytes:
    """One GET written byte for byte (an HTTP client library would refuse to send these); the reply's status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers + b"\r\n")
        return conn.makefile("rb").readline()


async def test_control_characters_from_a_caller_are_escaped_in_the_text_access_log(
    start_replica: StartReplica, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get(FORGING_PATH, headers={"X-Request-ID": "forge-1"})).status_code == 404
            assert (await http.get(TERMINAL_PATH, headers={"X-Request-ID": "term-2"})).status_code == 404
            deployment_path = "/rec%1b[2J"
            assert (await http.post(deployment_path, json=1, headers={"X-Request-ID": "post-3"})).status_code == 404
            # Spaces: the fields of a line of its own, had they been written as spaces.
            fields_path = "/rec%20200%200.50ms%20deployment=rec%20request_id=forged"
            assert (await http.post(fields_path, json=1, headers={"X-Request-ID": "fields-4"})).status_code == 404
            spaced = {"X-Request-ID": "id with spaces deployment=pwn"}
            assert (await http.get("/-/status", headers=spaced)).status_code == 200
            refused = await http.get("/-/spaced-id", headers=spaced)  # refused for its id, with a new one
            assert refused.status_code == 400 and "X-Request-ID must be" in refused.json()["message"]
        # Bytes no client library sends: a C1 control (CSI) and UTF-8 for U+202E in the header, which the HTTP
        # parser takes as obs-text (ESC itself it refuses, before the gateway sees the request).
        assert _raw_get(port, b"/-/docs", b"X-Request-ID: a\x9b31m\xe2\x80\xae\r\n") == b"HTTP/1.1 200 OK\r\n"
        wait_for(
            lambda: any("/-/docs" in line for line in access_lines(tmp_path)), 5, lambda: str(access_lines(tmp_path))
        )
    log = b"".join(p.read_bytes() for p in tmp_path.glob("gateway-*.log"))
    assert all(line.isprintable() for line in log.decode().splitlines()), log[-2000:]
    lines = access_lines(tmp_path)
    assert not any(line.startswith("FORGED") for line in log.decode().splitlines())

    def line_of(marker: str) -> str:
        found = [line for line in lines if marker in line]
        assert len(found) == 1, (marker, lines)
        return found[0]

    assert " GET /-/x\\nFORGED%20POST%20/-/deploy%20200 404 " in line_of("request_id=forge-1")
    assert " POST /rec%20200%200.50ms%20deployment=rec%20request_id=forged 404 " in line_of("request_id=fields-4")
    assert " GET /-/y\\x1b[2J\\x1b]52;c;aGk=\\x07\\r\\x9b31m 404 " in line_of("request_id=term-2")
    assert " POST /rec\\x1b[2J 404 " in line_of("request_id=post-3")
    assert line_of("/-/spaced-id").endswith(f" request_id={refused.headers['X-Request-ID']}")
    assert line_of("/-/status").endswith(" request_id=-") and not any("pwn" in line for line in lines)
    assert line_of("/-/docs").endswith(" request_id=-")
