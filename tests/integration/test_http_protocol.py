"""The gateway's HTTP protocol (app/http_protocol.py) in-process, where the order of events is ours to choose: who
makes room at the cap, and a refused client that sent its request before the server accepted it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import orjson
import pytest
import uvicorn
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.server import ServerState

from streamserve.app.http_protocol import (
    ConnectionLimits,
    GatewayHttpProtocol,
    start_chunked,
    when_gone,
    write_chunk,
    write_response,
)
from tests.harness.waiting import wait_for_async

GET = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
MAX_HEAD_BYTES = 256 * 1024
App = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


@dataclass
class Served:
    port: int
    state: ServerState
    release: asyncio.Event = field(default_factory=asyncio.Event)
    clients: list[socket.socket] = field(default_factory=list)

    def connect(self) -> socket.socket:
        """A client connection, made (by the kernel) whether or not the server has accepted it yet."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.clients.append(sock)
        return sock

    async def accepted(self, count: int) -> None:
        await wait_for_async(lambda: len(self.state.connections) == count, 5, f"{count} connections never held")


@asynccontextmanager
async def serving(max_connections: int, written: bool = False, app: App | None = None) -> AsyncIterator[Served]:
    """GatewayHttpProtocol on a free port of this event loop, for an app that answers ``ok``, or (``/hold``) waits
    for ``release`` first; ``written``: the answer written by ``write_response`` (the gateway's unary replies).
    ``app``: another app instead."""
    release = asyncio.Event()

    async def ok_app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        assert scope["type"] == "http"
        if scope["path"] == "/hold":
            await release.wait()
        if written:
            assert write_response(scope, 200, [(b"x-written", b"yes")], b"ok")
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    config = uvicorn.Config(app or ok_app, http=GatewayHttpProtocol, lifespan="off", log_config=None)
    config.load()
    limits = ConnectionLimits(header_timeout_s=10.0, max_connections=max_connections, max_head_bytes=MAX_HEAD_BYTES)
    GatewayHttpProtocol.configure(limits)
    state = ServerState()
    server = await asyncio.get_running_loop().create_server(
        lambda: GatewayHttpProtocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0
    )
    served = Served(server.sockets[0].getsockname()[1], state, release)
    try:
        yield served
    finally:
        release.set()
        for sock in served.clients:
            sock.close()
        server.close()
        await wait_for_async(lambda: not state.connections and not state.tasks, 5, "connections left open")
        await server.wait_closed()


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    return data


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


async def test_a_refused_client_reads_its_whole_503_though_its_request_came_before_the_accept() -> None:
    async with serving(max_connections=1) as served:
        served.connect().sendall(b"GET /hold HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await wait_for_async(lambda: len(served.state.tasks) == 1, 5, "the first request never started")
        late = served.connect()
        late.sendall(GET)  # before the event loop runs again, so before the server accepts the connection
        answer = await asyncio.to_thread(_read_until_closed, late)
    assert answer.startswith(b"HTTP/1.1 503 ") and answer.endswith(b"}"), answer
    assert b'"error":"OverloadedError"' in answer


@pytest.mark.parametrize("where", ["header value", "url"])
async def test_a_head_past_its_limit_is_answered_431_before_it_ends(where: str) -> None:
    """httptools and uvicorn join a long header value or URL in time that grows with the square of its length: the
    answer comes once MAX_HEAD_BYTES are in, and the rest of the head is never read."""
    async with serving(max_connections=4) as served:
        sock = served.connect()
        start = b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " if where == "header value" else b"POST /x?q="
        sock.sendall(start)
        for _ in range(MAX_HEAD_BYTES // 65536 + 2):  # just past the limit; the head never ends
            sock.sendall(b"a" * 65536)
        answer = await asyncio.to_thread(_read_until_closed, sock)
        ok = served.connect()  # the gateway serves on
        ok.sendall(GET)
        assert (await asyncio.to_thread(_read_until, ok, b"ok")).startswith(b"HTTP/1.1 200 ")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert orjson.loads(body)["message"] == (
        f"the request's line and headers passed {MAX_HEAD_BYTES} bytes (4 x max_header_bytes)"
    )


async def test_a_head_within_its_limit_is_served_however_it_arrives() -> None:
    """Many short headers, a byte at a time at first: a head near the limit is served (its count is not a header's)."""
    async with serving(max_connections=4) as served:
        sock = served.connect()
        headers = b"".join(b"X-%d: v\r\n" % i for i in range(20_000))  # 200 KB as sent, 120 KB of names and values
        request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n"
        for byte in request[:100]:
            sock.sendall(bytes([byte]))
        sock.sendall(request[100:])
        answer = await asyncio.to_thread(_read_until, sock, b"ok")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


@pytest.mark.parametrize(
    ("request_head", "said"),
    [
        (
            b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k\x01z\r\nContent-Length: 0\r\n\r\n",
            "the request is not valid HTTP/1.1: Invalid header value char",
        ),
        (  # a token, but no method HTTP has
            b"FOO /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
            "the request is not valid HTTP/1.1: its method is none of HTTP's own",
        ),
        (  # (each of these was said to be a bad method or character)
            b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 7\r\nContent-Length: 3\r\n\r\n",
            "the request is not valid HTTP/1.1: Duplicate Content-Length",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "the request is not valid HTTP/1.1: Transfer-Encoding can't be present with Content-Length",
        ),
        (b"POST /x HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n", "the request is not valid HTTP/1.1: Invalid HTTP version"),
        (  # a callback's failure (uvicorn's parsing of the URL) has no llhttp reason worth telling
            b"GET http://a:99999999/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "the request is not valid HTTP/1.1: its method is none of HTTP's own",
        ),
    ],
)
async def test_bytes_that_are_no_http_request_get_a_json_400(request_head: bytes, said: str) -> None:
    async with serving(max_connections=4) as served:
        sock = served.connect()
        sock.sendall(request_head)
        answer = await asyncio.to_thread(_read_until_closed, sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower(), answer
    error = orjson.loads(body)
    assert error["error"] == "BadRequestError", answer
    assert error["message"].startswith(said), error


async def test_at_the_cap_the_connection_waiting_longest_makes_room() -> None:
    async with serving(max_connections=2) as served:
        oldest = served.connect()
        oldest.sendall(b"GET / HTTP/1.1\r\nHost: 1")  # its headers never end
        await served.accepted(1)
        newer = served.connect()
        newer.sendall(GET)
        assert (await asyncio.to_thread(_read_until, newer, b"ok")).startswith(b"HTTP/1.1 200 ")  # idle now, kept alive
        await served.accepted(2)
        newest = served.connect()
        newest.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await asyncio.to_thread(_read_until_closed, newest)).endswith(b"ok")
        assert await asyncio.to_thread(_read_until_closed, oldest) == b""  # closed to make room, without a word
        newer.setblocking(False)
        with pytest.raises(BlockingIOError):
            newer.recv(1)  # still open


@pytest.mark.parametrize("written", [False, True], ids=["sent", "written"])
async def test_a_kept_alive_connection_between_requests_makes_room_too(written: bool) -> None:
    """Also after an answer from ``write_response`` (it completes the request as uvicorn's ``send`` would)."""
    async with serving(max_connections=1, written=written) as served:
        idle = served.connect()
        idle.sendall(GET)
        assert (await asyncio.to_thread(_read_until, idle, b"ok")).startswith(b"HTTP/1.1 200 ")
        newest = served.connect()
        newest.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await asyncio.to_thread(_read_until_closed, newest)).endswith(b"ok")
        assert await asyncio.to_thread(_read_until_closed, idle) == b""


def _read_responses(sock: socket.socket, count: int) -> bytes:
    data = b""
    while data.count(b"\r\n\r\nok") < count:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    return data


def _responses(data: bytes) -> list[bytes]:
    """The heads of the whole responses in ``data`` (each with a content-length body of ``ok``)."""
    heads = data.split(b"\r\n\r\nok")
    assert heads[-1] == b"", data  # nothing after the last whole response
    return heads[:-1]


async def test_a_written_response_is_whole_and_keeps_the_connection_for_pipelined_requests() -> None:
    async with serving(max_connections=4, written=True) as served:
        client = served.connect()
        client.sendall(GET * 3)  # pipelined: the second and third wait for the first's response to complete
        heads = _responses(await asyncio.to_thread(_read_responses, client, 3))
        assert len(heads) == 3
        for head in heads:
            lines = head.split(b"\r\n")
            assert lines[0] == b"HTTP/1.1 200 OK", head
            fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
            assert fields[b"content-length"] == b"2" and fields[b"x-written"] == b"yes", head
            assert b"connection" not in fields, head  # kept alive


async def test_a_written_response_to_connection_close_says_so_and_closes() -> None:
    async with serving(max_connections=4, written=True) as served:
        client = served.connect()
        client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        (head,) = _responses(await asyncio.to_thread(_read_until_closed, client))
        assert b"\r\nconnection: close" in head.lower(), head


async def test_a_stream_begun_with_its_first_chunk_is_a_whole_chunked_response_on_a_kept_connection() -> None:
    """start_chunked (a stream's head and first chunk in one write), write_chunk, then ASGI's end."""

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        assert start_chunked(scope, [(b"x-first", b"yes")], b'{"n":1}')
        assert not start_chunked(scope, [], b"again")  # begun already: nothing written
        assert write_chunk(scope, b'{"n":2}')
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async with serving(max_connections=4, app=app) as served:
        client = served.connect()
        client.sendall(GET * 2)  # the second is answered after the first completed: kept alive
        data = await asyncio.to_thread(_read_until_count, client, b"\r\n0\r\n\r\n", 2)
    for answer in data.split(b"\r\n0\r\n\r\n")[:2]:
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"HTTP/1.1 200 OK", head
        fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
        assert fields[b"transfer-encoding"] == b"chunked" and fields[b"x-first"] == b"yes", head
        assert b"connection" not in fields and b"content-length" not in fields, head
        assert body == b'7\r\n{"n":1}\r\n7\r\n{"n":2}', answer


async def test_when_gone_tells_of_a_client_leaving_mid_answer_and_at_once_of_one_gone_before() -> None:
    left: list[str] = []
    hooked = asyncio.Event()
    release = asyncio.Event()

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["path"] == "/late":
            await release.wait()  # its client is gone by now
            assert when_gone(scope, lambda: left.append("late"))
            return
        assert when_gone(scope, lambda: left.append("mid"))
        assert start_chunked(scope, [], b"1")
        hooked.set()
        await release.wait()

    async with serving(max_connections=4, app=app) as served:
        client = served.connect()
        client.sendall(GET)
        await asyncio.wait_for(hooked.wait(), 5)
        client.close()
        await wait_for_async(lambda: left == ["mid"], 5, f"the leaving was not told: {left}")
        late = served.connect()
        late.sendall(b"GET /late HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await served.accepted(1)
        late.close()
        await served.accepted(0)
        release.set()
        await wait_for_async(lambda: left == ["mid", "late"], 5, f"a leaving before the hook was not told: {left}")


def _read_until_count(sock: socket.socket, end: bytes, count: int) -> bytes:
    data = b""
    while data.count(end) < count:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    return data


@pytest.mark.parametrize(
    ("second", "status", "error"),
    [
        (b"GARBAGE\r\n\r\n", 400, "BadRequestError"),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414, "URITooLongError"),
        (
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 65536),
            431,
            "HeadersTooLargeError",
        ),
    ],
    ids=["malformed", "url too long", "head too long"],
)
async def test_bytes_that_are_no_request_behind_one_in_progress_are_answered_after_it(
    second: bytes, status: int, error: str
) -> None:
    """RFC 9112, 9.3.2: answers in the order the requests came. uvicorn wrote the error at once and closed, and the
    request in progress, which may have run, was never answered."""
    async with serving(max_connections=4) as served:
        client = served.connect()
        await asyncio.to_thread(client.sendall, b"GET /hold HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + second)
        await wait_for_async(lambda: len(served.state.tasks) == 1, 5, "the first request never started")
        served.release.set()
        data = await asyncio.to_thread(_read_until_closed, client)
    first, _, rest = data.partition(b"\r\n\r\nok")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n"), data[:300]
    head, _, body = rest.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status) and b"\r\nconnection: close" in head.lower(), data[:300]
    assert orjson.loads(body)["error"] == error, body
