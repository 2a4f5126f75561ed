"""Streaming through real processes: `streamserve up`, a gateway, a scheduler and replica processes; HTTP clients
that read NDJSON and Server-Sent Events as they come, the Python client, errors after chunks, deadlines over the
whole stream, and a slow reader that holds the generator back."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from streamserve import Client
from streamserve.app.streaming_response import STUCK_LINGER_S, STUCK_WRITE_GRACE_S
from streamserve.errors import BadRequestError, RemoteError, RequestTimeoutError
from tests.harness.farm import Farm, running_farm_of
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: tokens
    import_path: examples.tokens:generate
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: count
    import_path: tests.stream_deployments:count_to
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: failing
    import_path: tests.stream_deployments:fail_after
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: slow
    import_path: tests.stream_deployments:sync_slow
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: sleepy
    import_path: examples.sleepy:Sleepy
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: big
    import_path: tests.stream_e2e_deployments:big_chunks_noting_progress
    num_replicas: 1
    max_unread_chunks: 8
    graceful_shutdown_timeout_s: 2
"""


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("streaming")) as farm:
        yield farm


def test_ndjson_lines_arrive_as_the_handler_yields_them(farm: Farm) -> None:
    body = {"text": "one two three", "delay_s": 0.4}
    arrived: list[tuple[float, dict[str, object]]] = []
    with httpx.stream("POST", f"{farm.base_url}/tokens", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        assert response.headers["x-deployment"] == "tokens" and response.headers["x-request-id"]
        for line in response.iter_lines():
            arrived.append((time.monotonic(), orjson.loads(line)))
    assert [chunk for _, chunk in arrived] == [
        {"token": "one", "index": 0},
        {"token": "two", "index": 1},
        {"token": "three", "index": 2},
    ]
    # Each line came when it was made (0.4 s apart), not all at the end.
    assert arrived[1][0] - arrived[0][0] > 0.2 and arrived[2][0] - arrived[1][0] > 0.2


def tokens_of(farm: Farm, text: str, request_id: str, lines: int | None = None) -> list[str]:
    """The tokens of a /tokens stream of ``text`` sent with ``request_id``; ``lines``: leave after that many."""
    body = {"text": text, "delay_s": 0.05}
    got: list[str] = []
    headers = {"X-Request-ID": request_id}
    with httpx.stream("POST", f"{farm.base_url}/tokens", json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200 and response.headers["x-request-id"] == request_id
        for line in response.iter_lines():
            chunk = orjson.loads(line)
            assert "token" in chunk, chunk
            got.append(chunk["token"])
            if len(got) == lines:
                break  # the connection closes with the block
    return got


def test_streams_that_share_a_request_id_each_get_only_their_own_chunks(farm: Farm) -> None:
    texts = ["a1 a2 a3 a4 a5 a6", "b1 b2 b3 b4 b5 b6"]
    with ThreadPoolExecutor(2) as pool:  # at once, through one gateway
        both = list(pool.map(lambda text: tokens_of(farm, text, "same-id"), texts))
    assert both == [text.split() for text in texts]
    # A caller that leaves after a chunk and comes back at once with the same id gets the new stream only.
    assert tokens_of(farm, "c1 c2 c3 c4 c5 c6", "again-id", lines=1) == ["c1"]
    assert tokens_of(farm, "d1 d2 d3", "again-id") == ["d1", "d2", "d3"]


def test_unary_calls_that_share_a_request_id_each_get_their_own_answer(farm: Farm) -> None:
    def slept(seconds: float) -> object:
        headers = {"X-Request-ID": "shared-id"}
        response = httpx.post(f"{farm.base_url}/sleepy", json={"seconds": seconds}, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(slept, [0.4, 0.2])) == [{"slept": 0.4}, {"slept": 0.2}]


def test_server_sent_events(farm: Farm) -> None:
    headers = {"Accept": "text/event-stream"}
    response = httpx.post(f"{farm.base_url}/count", json=3, headers=headers, timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.text == 'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\n'


def test_an_error_after_chunks_ends_the_stream_so_that_clients_can_tell(farm: Farm) -> None:
    """SSE: an `error` event. NDJSON: a last line with the error, and no clean end of the body."""
    sse = httpx.post(f"{farm.base_url}/failing", json=2, headers={"Accept": "text/event-stream"}, timeout=30)
    events = sse.text.split("\n\n")
    assert events[:2] == ["data: 0", "data: 1"]
    assert events[2].startswith("event: error\ndata: ")
    error = orjson.loads(events[2].partition("data: ")[2])
    assert error["error"] == "ValueError" and error["message"] == "boom after 2" and error["request_id"]

    lines: list[bytes] = []
    cut = pytest.raises(httpx.RemoteProtocolError)  # the body was cut: no terminating chunk
    with cut, httpx.stream("POST", f"{farm.base_url}/failing", json=2, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line.encode())
    assert lines[:2] == [b"0", b"1"] and orjson.loads(lines[2])["error"] == "ValueError"

    before = httpx.post(f"{farm.base_url}/failing", json=0, timeout=30)  # no chunk yet: an ordinary error
    assert before.status_code == 500 and before.json()["error"] == "ValueError"


def test_the_python_client_streams_and_raises_after_the_chunks(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        assert list(client.stream("count", 4)) == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}]
        got: list[object] = []
        with pytest.raises(RemoteError, match="boom after 3"):
            for chunk in client.stream("failing", 3):
                got.append(chunk)
        assert got == [0, 1, 2]
        with pytest.raises(BadRequestError, match=r"stream\(\)"):
            client.call("count", 2)


def test_the_deadline_bounds_the_whole_stream(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        got: list[object] = []
        with pytest.raises(RequestTimeoutError):
            for chunk in client.stream("slow", 0.2, timeout=1.0):
                got.append(chunk)
        assert 1 <= len(got) < 10, got
    sse = httpx.post(
        f"{farm.base_url}/slow",
        json=0.2,
        headers={"Accept": "text/event-stream", "X-Request-Timeout": "1"},
        timeout=30,
    )
    assert sse.status_code == 200 and "event: error" in sse.text, sse.text[-300:]


@contextlib.contextmanager
def big_stream_to_a_slow_reader(farm: Farm, progress: Path, headers: str = "") -> Iterator[socket.socket]:
    """A raw socket with a small receive buffer that has sent ``POST /big`` for 500 chunks of 64 KiB (the generator
    notes how far it got in ``progress``), with more header lines ``headers`` (each ending in CRLF); nothing read."""
    body = orjson.dumps({"n": 500, "size": 65536, "path": str(progress)})
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", int(farm.base_url.rpartition(":")[2])))
        request = (
            f"POST /big HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(request + body)
        yield sock


def test_a_slow_reader_holds_the_generator_back(farm: Farm, tmp_path: Path) -> None:
    """500 chunks of 64 KiB (32 MB) to a reader that stops after one line: the generator stops soon after, held by
    max_unread_chunks (8) once the sockets' buffers are full; then the reader takes the rest and all of it comes."""
    progress = tmp_path / "progress"
    with big_stream_to_a_slow_reader(farm, progress) as sock:
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]

        seen = [""]

        def stalled() -> bool:
            """The generator has gone as far as it will while nobody reads: no progress since the last look."""
            now = progress.read_text() if progress.exists() else ""
            still, seen[0] = now != "" and now == seen[0], now
            return still

        wait_for(stalled, 30, "the generator never stopped for the slow reader", interval_s=1.0)
        held_at = int(progress.read_text())
        print(f"with the reader stopped, the generator got to chunk {held_at} of 500")
        assert held_at < 250, f"the generator ran on to chunk {held_at} with nobody reading"

        received, tail = len(first), first[-5:]
        while tail != b"0\r\n\r\n":  # read on to the body's clean end (its terminating chunk)
            data = sock.recv(1 << 20)
            if not data:
                break
            received, tail = received + len(data), (tail + data)[-5:]
    assert int(progress.read_text()) == 499 and received > 500 * 65536


@pytest.mark.parametrize("sse", [True, False], ids=["sse", "ndjson"])
def test_a_reader_stopped_past_the_deadline_still_learns_why_its_stream_ended(
    farm: Farm, tmp_path: Path, sse: bool
) -> None:
    """A client that stops reading while the gateway's writes wait for it: once the deadline (and a grace) passed,
    the gateway gives up on its waiting write, and when the client reads on it finds the stream ended as any
    deadline ends one: SSE's error event and the body's end, or NDJSON's error line and no end."""
    accept = "text/event-stream" if sse else "application/x-ndjson"
    timed_out = counted(farm, 'streamserve_requests_total{code="504",deployment="big"}')
    headers = f"Accept: {accept}\r\nX-Request-Timeout: 2\r\n"
    with big_stream_to_a_slow_reader(farm, tmp_path / "progress", headers) as sock:
        received = sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        wait_for(
            lambda: counted(farm, 'streamserve_requests_total{code="504",deployment="big"}') > timed_out,
            30,
            "the gateway never gave up on the stream whose client stopped reading",
            interval_s=0.5,
        )
        while data := sock.recv(1 << 20):  # read on: the gateway closes the connection after the end
            received += data[-(1 << 16) :] if len(received) > 1 << 20 else data
            received = received[-(1 << 20) :]
    if sse:
        assert received.endswith(b"\n\n\r\n0\r\n\r\n"), received[-300:]  # the error event, then the body's end
        _, found, event = received.rpartition(b"event: error\ndata: ")
        assert found and event.endswith(b"\n\n\r\n0\r\n\r\n"), received[-300:]  # the last event
        error = orjson.loads(event.removesuffix(b"\n\n\r\n0\r\n\r\n"))
    else:
        assert received.endswith(b"\n\r\n"), received[-300:]  # a line, and no terminating chunk after it
        error = orjson.loads(received[: -len(b"\n\r\n")].rpartition(b"\n")[2])
    assert error["error"] == "RequestTimeoutError" and "too slowly" in error["message"], error


def test_a_reader_that_never_reads_on_is_cut_off(farm: Farm, tmp_path: Path) -> None:
    """The end of a stream whose client stopped reading waits behind what its connection holds only for a while
    (STUCK_LINGER_S): then the gateway resets the connection, and the kernel drops what it still held to send (a
    plain close would leave it sending to the slow reader for minutes)."""
    port = int(farm.base_url.rpartition(":")[2])
    headers = "Accept: text/event-stream\r\nX-Request-Timeout: 1\r\n"
    with big_stream_to_a_slow_reader(farm, tmp_path / "progress", headers) as sock:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        mine = sock.getsockname()[1]
        assert gateway_end(port, mine) == "held"
        wait_for(
            lambda: gateway_end(port, mine) == "gone",
            STUCK_WRITE_GRACE_S + STUCK_LINGER_S + 20,
            lambda: f"the gateway's end of the connection of a client that never read on is {gateway_end(port, mine)}",
            interval_s=0.5,
        )


def gateway_end(local_port: int, remote_port: int) -> str:
    """The TCP connection from ``local_port`` to ``remote_port`` on 127.0.0.1: "held" by a process, "orphaned"
    (closed by its process, its kernel still sending what it holds: listed with inode 0), or "gone"."""
    ends = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == ends:
            return "held" if fields[9] != "0" else "orphaned"
    return "gone"


def counted(farm: Farm, series: str) -> float:
    """The value of one series of the farm's /metrics (0 when absent)."""
    text = httpx.get(f"{farm.base_url}/metrics", timeout=10).text
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(series + " ")), 0.0)


def cancelled_while_running(farm: Farm, deployment: str) -> float:
    return counted(farm, f'streamserve_cancelled_requests_total{{deployment="{deployment}",stage="running"}}')


def test_ctrl_c_on_streamserve_call_cancels_the_stream(farm: Farm) -> None:
    """SIGINT to `streamserve call` in the middle of a stream: it exits 130, and the generator is closed in the
    replica (not left to run to its end or its deadline)."""
    before = cancelled_while_running(farm, "slow")
    env = {**farm.env(), "REDIS_URL": farm.effective_redis_url}
    argv = [farm.command, "call", "slow", "0.2"]
    with subprocess.Popen(argv, cwd=farm.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as cli:
        try:
            assert cli.stdout is not None and cli.stdout.readline() == b"0\n"  # the stream runs
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=30) == 130
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
        assert cli.stderr is not None and b"interrupted" in cli.stderr.read()
    wait_for(
        lambda: cancelled_while_running(farm, "slow") == before + 1,
        10,
        lambda: f"cancelled while running: {cancelled_while_running(farm, 'slow')}, was {before}",
    )


def test_streamserve_call_prints_each_chunk_as_a_line(farm: Farm) -> None:
    """The CLI's `call` streams: one JSON line per chunk, and a unary answer's one line is unchanged."""
    printed = farm.cli("call", "count", "3").stdout
    assert printed.splitlines() == ['{"i":0}', '{"i":1}', '{"i":2}']
    failed = farm.cli("call", "failing", "2", check=False)
    assert failed.stdout.splitlines() == ["0", "1"] and failed.returncode != 0
    assert "ValueError: boom after 2" in failed.stderr
