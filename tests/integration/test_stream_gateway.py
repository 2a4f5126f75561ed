"""The gateway's side of streaming (issue 28): a deployment POST answered by a streaming handler, played on the wire by
the test (tests/integration/fake_stream_replica.py).

The gateway app is driven in-process through ASGI, so that each message it sends is seen as it is sent; a real
gateway process serves the tests that must see the connection cut (an NDJSON stream that ended in an error)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from starlette.types import Message

from streamserve.app.gateway import GatewayApp, create_app
from streamserve.app.streaming_response import StreamCut
from streamserve.runtime.settings import Settings
from tests.harness.farm import gateway_process
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import deploy
from tests.integration.fake_stream_replica import FakeStreamReplica

NDJSON = b"application/x-ndjson"
SSE = b"text/event-stream"


class AsgiCall:
    """One POST driven through the app's ASGI interface: every message it sends is queued as it is sent.

    ``disconnect()`` makes the client go away; ``hold()`` makes body writes wait (a client that reads slowly) until
    ``release()``."""

    def __init__(
        self, app: GatewayApp, path: str, body: bytes = b"null", headers: dict[str, str] | None = None
    ) -> None:
        self.app = app
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000),
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        }
        self.body = body
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        self._gone = asyncio.Event()
        self._open = asyncio.Event()
        self._open.set()
        self._body_given = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> AsgiCall:
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        return self

    async def _receive(self) -> Message:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            await self._open.wait()
        await self.messages.put(message)

    async def next(self, timeout_s: float = 10.0) -> Message:
        return await asyncio.wait_for(self.messages.get(), timeout_s)

    async def start_message(self) -> tuple[int, dict[bytes, bytes]]:
        message = await self.next()
        assert message["type"] == "http.response.start", message
        return message["status"], dict(message["headers"])

    def disconnect(self) -> None:
        self._gone.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def done(self) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[GatewayApp]:
    await deploy(settings, name="tokens", route_prefix="/tokens")
    gateway_app = create_app(settings)
    await gateway_app.gateway.client.start()
    try:
        yield gateway_app
    finally:
        await gateway_app.gateway.client.aclose()


@pytest.fixture
def observed(app: GatewayApp, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """(status, replica) of each request the gateway counts and logs, as it does."""
    seen: list[tuple[int, str]] = []
    done = app.gateway.observer.done

    def note(
        method: str,
        path: str,
        status: int,
        started: float,
        request_id: str,
        deployment: str,
        replica: str,
        tenant: str = "",
        trace_id: str = "",
    ) -> None:
        seen.append((status, replica))
        done(method, path, status, started, request_id, deployment, replica, tenant, trace_id)

    monkeypatch.setattr(app.gateway.observer, "done", note)
    return seen


@pytest.fixture
async def fake(settings: Settings, aredis: aioredis.Redis, app: GatewayApp) -> FakeStreamReplica:
    return await FakeStreamReplica.start(aredis, settings, "tokens", window=8)


def feeds(app: GatewayApp) -> int:
    replies = app.gateway.client._replies
    assert replies is not None
    return len(replies._feeds)


async def test_ndjson_lines_are_written_as_the_chunks_come(
    app: GatewayApp, fake: FakeStreamReplica, observed: list[tuple[int, str]]
) -> None:
    call = AsgiCall(app, "/tokens", b'{"n": 3}', {"X-Request-ID": "stream-1"}).start()
    request = await fake.next_request()
    assert request.stream and request.request_id == "stream-1"
    await fake.chunks(request, ["a"])
    status, headers = await call.start_message()
    assert status == 200 and headers[b"content-type"] == NDJSON
    assert (headers[b"x-request-id"], headers[b"x-deployment"], headers[b"x-replica"]) == (
        b"stream-1",
        b"tokens",
        fake.replica_id.encode(),
    )
    assert b"content-length" not in headers
    assert await call.next() == {"type": "http.response.body", "body": b'"a"\n', "more_body": True}
    # Only now does the replica make the next ones: the first line was not held back for them.
    await fake.chunks(request, [{"b": 1}, 2])
    assert await call.next() == {"type": "http.response.body", "body": b'{"b":1}\n2\n', "more_body": True}
    await fake.end(request)
    assert await call.next() == {"type": "http.response.body", "body": b"", "more_body": False}
    await call.done()
    assert observed == [(200, fake.replica_id)] and feeds(app) == 0


async def test_sse_frames_each_chunk_as_a_data_event(app: GatewayApp, fake: FakeStreamReplica) -> None:
    call = AsgiCall(app, "/tokens", headers={"Accept": "text/event-stream"}).start()
    request = await fake.next_request()
    await fake.chunks(request, ["a", {"b": [1, 2]}])
    status, headers = await call.start_message()
    assert status == 200 and headers[b"content-type"] == SSE and headers[b"cache-control"] == b"no-cache"
    assert (await call.next())["body"] == b'data: "a"\n\ndata: {"b":[1,2]}\n\n'
    await fake.chunks(request, ["c"])
    assert (await call.next())["body"] == b'data: "c"\n\n'
    await fake.end(request)
    assert await call.next() == {"type": "http.response.body", "body": b"", "more_body": False}
    await call.done()


async def test_sse_ends_a_failed_stream_with_an_error_event(
    app: GatewayApp, fake: FakeStreamReplica, observed: list[tuple[int, str]]
) -> None:
    call = AsgiCall(app, "/tokens", headers={"Accept": "application/json, text/event-stream", "X-Request-ID": "s-2"})
    call.start()
    request = await fake.next_request()
    await fake.chunks(request, [1])
    await fake.fail(request, "ValueError", "boom")
    assert (await call.start_message())[0] == 200
    assert (await call.next())["body"] == b"data: 1\n\n"
    last = await call.next()
    assert last["body"] == b'event: error\ndata: {"error":"ValueError","message":"boom","request_id":"s-2"}\n\n'
    assert not last.get("more_body", False)  # the response ends normally
    await call.done()
    assert observed == [(500, fake.replica_id)]


async def test_ndjson_ends_a_failed_stream_with_an_error_line_and_no_end_of_body(
    app: GatewayApp, fake: FakeStreamReplica, observed: list[tuple[int, str]]
) -> None:
    call = AsgiCall(app, "/tokens", headers={"X-Request-ID": "s-3"}).start()
    request = await fake.next_request()
    await fake.chunks(request, [1, 2])
    await fake.fail(request, "ValueError", "boom")
    assert (await call.start_message())[0] == 200
    assert (await call.next())["body"] == b"1\n2\n"
    last = await call.next()
    assert orjson.loads(last["body"]) == {"error": "ValueError", "message": "boom", "request_id": "s-3"}
    assert last["body"].endswith(b"\n") and last["more_body"] is True  # never the end of the body
    with pytest.raises(StreamCut):
        await call.done()  # the server cuts the connection (see the real gateway's tests below)
    assert call.messages.empty()
    assert observed == [(500, fake.replica_id)]


@pytest.mark.parametrize("accept", ["application/x-ndjson", "text/event-stream"])
async def test_an_error_before_the_first_chunk_is_an_ordinary_error_response(
    app: GatewayApp, fake: FakeStreamReplica, accept: str
) -> None:
    call = AsgiCall(app, "/tokens", headers={"Accept": accept, "X-Request-ID": "s-4"}).start()
    await fake.fail(await fake.next_request(), "KeyError", "'prompt'")
    status, headers = await call.start_message()
    assert status == 500 and headers[b"content-type"] == b"application/json"
    assert headers[b"x-replica"] == fake.replica_id.encode() and headers[b"x-request-id"] == b"s-4"
    body = await call.next()
    assert orjson.loads(body["body"]) == {"error": "KeyError", "message": "'prompt'", "request_id": "s-4"}
    await call.done()


async def test_a_unary_answer_is_sent_as_before(
    app: GatewayApp, fake: FakeStreamReplica, observed: list[tuple[int, str]]
) -> None:
    call = AsgiCall(app, "/tokens", b"[1, 2]").start()
    request = await fake.next_request()
    assert request.stream  # every deployment POST takes a stream; the unary handler answers once
    await fake.answer(request, {"sum": 3})
    status, headers = await call.start_message()
    assert status == 200 and headers[b"content-type"] == b"application/json" and headers[b"content-length"] == b"9"
    assert await call.next() == {"type": "http.response.body", "body": b'{"sum":3}'}
    await call.done()
    assert observed == [(200, fake.replica_id)] and feeds(app) == 0


@pytest.mark.parametrize("accept", ["application/x-ndjson", "text/event-stream"])
async def test_the_request_timeout_bounds_the_whole_stream(
    app: GatewayApp, fake: FakeStreamReplica, observed: list[tuple[int, str]], accept: str
) -> None:
    call = AsgiCall(app, "/tokens", headers={"Accept": accept, "X-Request-Timeout": "0.5", "X-Request-ID": "s-5"})
    loop = asyncio.get_running_loop()
    started = loop.time()
    call.start()
    request = await fake.next_request()

    producer = asyncio.create_task(fake.send_forever(request, "tick"))  # a chunk every 20 ms, never an end
    try:
        assert (await call.start_message())[0] == 200
        bodies = []
        while not (bodies and b"RequestTimeoutError" in bodies[-1]["body"]):
            bodies.append(await call.next())
        if accept == "text/event-stream":
            await call.done()
            assert bodies[-1]["body"].startswith(b"event: error\ndata: ") and not bodies[-1].get("more_body")
        else:
            with pytest.raises(StreamCut):
                await call.done()
            assert orjson.loads(bodies[-1]["body"])["error"] == "RequestTimeoutError"
    finally:
        producer.cancel()
    assert 0.5 <= loop.time() - started < 3
    assert len(bodies) >= 2 and observed == [(504, fake.replica_id)]


async def test_a_client_that_goes_away_stops_the_writing_and_is_forgotten(
    app: GatewayApp, fake: FakeStreamReplica, observed: list[tuple[int, str]]
) -> None:
    call = AsgiCall(app, "/tokens").start()
    request = await fake.next_request()
    await fake.chunks(request, [1])
    assert (await call.start_message())[0] == 200
    assert (await call.next())["body"] == b"1\n"
    call.disconnect()
    await call.done()
    assert feeds(app) == 0
    await fake.chunks(request, [2])  # what the replica still sends goes nowhere
    await fake.end(request)
    assert call.messages.empty()
    assert observed == [(499, fake.replica_id)]


async def test_a_slow_http_reader_holds_the_generator_within_its_window(
    app: GatewayApp, fake: FakeStreamReplica
) -> None:
    call = AsgiCall(app, "/tokens").start()
    request = await fake.next_request()
    call.hold()  # the HTTP client reads nothing for now: the gateway's write waits
    generator = asyncio.create_task(fake.run_window(request, total=50))
    try:
        assert (await call.start_message())[0] == 200
        replies = app.gateway.client._replies
        assert replies is not None
        feed = replies.feed(request.tag)
        assert feed is not None

        def paused_at_the_window() -> bool:
            # Taken: what the gateway writes now. Reported to the replica once it is half a window (else 0).
            taken = feed._taken
            reported = taken if taken >= fake.window // 2 else 0
            return fake.paused and fake.sent[request.request_id] == reported + fake.window

        await wait_for_async(paused_at_the_window, 5, lambda: f"sent {fake.sent}, taken {feed._taken}")
        assert fake.sent[request.request_id] - feed._taken <= fake.window
        call.release()
        lines: list[bytes] = []
        while True:
            message = await call.next()
            lines += message["body"].splitlines()
            if not message.get("more_body"):
                break
        assert [orjson.loads(line) for line in lines] == list(range(50))
    finally:
        generator.cancel()
    await call.done()


# -- a real gateway process: the connection cut ----------------------------------------------------


@contextlib.asynccontextmanager
async def raw_post(port: int, path: str, headers: str = "") -> AsyncIterator[asyncio.StreamReader]:
    """A POST over a plain socket; yields the response's reader (its head comes with the stream's first chunk)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\n{headers}\r\nnull".encode())
        await writer.drain()
        yield reader
    finally:
        writer.close()


async def test_a_real_gateway_cuts_a_failed_ndjson_stream_and_ends_a_good_one(
    settings: Settings, aredis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    await deploy(settings, name="tokens", route_prefix="/tokens")
    fake = await FakeStreamReplica.start(aredis, settings, "tokens", window=8)
    with gateway_process(redis_url, tmp_path) as port:
        # httpx: the lines before the cut, the error line last, then an incomplete body.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            post = http.build_request("POST", "/tokens", json=None, headers={"X-Request-ID": "cut-1"})
            opening = asyncio.create_task(http.send(post, stream=True))
            request = await fake.next_request()
            await fake.chunks(request, ["a"])
            response = await opening  # its head comes with the first chunk
            try:
                lines = response.aiter_lines()
                assert await anext(lines) == '"a"'  # flushed before the next chunk exists
                await fake.chunks(request, ["b"])
                await fake.fail(request, "ValueError", "boom")
                got = []
                with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                    async for line in lines:
                        got.append(line)
            finally:
                await response.aclose()
        assert got[0] == '"b"'
        assert orjson.loads(got[-1]) == {"error": "ValueError", "message": "boom", "request_id": "cut-1"}

        # A raw socket: the cut stream has no zero-length chunk; a good one ends with it.
        async with raw_post(port, "/tokens") as reader:
            request = await fake.next_request()
            await fake.chunks(request, [1])
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
            await fake.fail(request, "ValueError", "boom")
            rest = await asyncio.wait_for(reader.read(), 10)  # up to the end of the connection
        assert b'"error":"ValueError"' in rest and not rest.endswith(b"0\r\n\r\n")
        async with raw_post(port, "/tokens") as reader:
            request = await fake.next_request()
            await fake.chunks(request, [1])
            await fake.end(request)
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        assert rest == b"2\r\n1\n\r\n0\r\n\r\n"

        # SSE over a real connection: the error event, then a proper end.
        async with raw_post(port, "/tokens", "Accept: text/event-stream\r\n") as reader:
            request = await fake.next_request()
            await fake.chunks(request, [1])
            await fake.fail(request, "ValueError", "boom")
            rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        assert b"event: error\ndata: " in rest
    log = next(tmp_path.glob("gateway-*.log")).read_text()
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_curl_exits_18_on_a_cut_ndjson_stream_and_0_on_a_whole_one(
    settings: Settings, aredis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    await deploy(settings, name="tokens", route_prefix="/tokens")
    fake = await FakeStreamReplica.start(aredis, settings, "tokens", window=8)
    with gateway_process(redis_url, tmp_path) as port:
        for ends_well, exit_code in ((False, 18), (True, 0)):
            curl = await asyncio.create_subprocess_exec(
                "curl", "-sN", f"http://127.0.0.1:{port}/tokens", "-d", "null", stdout=asyncio.subprocess.PIPE
            )
            try:
                request = await fake.next_request()
                await fake.chunks(request, ["a", "b"])
                await (fake.end(request) if ends_well else fake.fail(request, "ValueError", "boom"))
                out, _ = await asyncio.wait_for(curl.communicate(), 10)
            finally:
                if curl.returncode is None:
                    curl.kill()
                    await curl.wait()
            assert curl.returncode == exit_code
            lines = out.decode().splitlines()
            assert lines[:2] == ['"a"', '"b"']
            assert lines[2:] == ([] if ends_well else [lines[2]]) and (ends_well or '"error":"ValueError"' in lines[2])
