"""The caller's side of streaming (issue 28): AsyncClient.stream and Client.stream against a replica the test plays
on the wire (tests/integration/fake_stream_replica.py), on the real test Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient, Client
from streamserve.client.chunk_feed import ChunkFeed
from streamserve.client.chunk_stream import ChunkStream, ConcurrentReadError
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import (
    BadRequestError,
    RemoteError,
    RequestCancelledError,
    RequestTimeoutError,
    StreamServeError,
)
from streamserve.wire.ids import new_request_id
from streamserve.wire.messages import Reply, ReplyStatus, Request
from tests.harness.waiting import wait_for, wait_for_async
from tests.integration.conftest import deploy
from tests.integration.fake_stream_replica import FakeStreamReplica


@pytest.fixture
async def fake(settings: Settings, aredis: aioredis.Redis) -> FakeStreamReplica:
    await deploy(settings, name="tokens", route_prefix="/tokens")
    return await FakeStreamReplica.start(aredis, settings, "tokens", window=4)


async def collect(chunks: AsyncIterator[Any]) -> tuple[list[Any], StreamServeError | None]:
    """The chunks of a stream and the error that ended it (None: it ended well)."""
    got: list[Any] = []
    try:
        async for chunk in chunks:
            got.append(chunk)
    except StreamServeError as exc:
        return got, exc
    return got, None


def collect_blocking(chunks: Iterator[Any]) -> tuple[list[Any], StreamServeError | None]:
    got: list[Any] = []
    try:
        for chunk in chunks:
            got.append(chunk)
    except StreamServeError as exc:
        return got, exc
    return got, None


def feed_count(client: AsyncClient) -> int:
    """Streams the client still follows (each one forgotten once its consumer is done)."""
    assert client._replies is not None
    return len(client._replies._feeds)


async def test_chunks_come_in_order_as_they_are_sent_and_the_end_ends_the_iteration(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    stream = client.stream("tokens", {"prompt": "hi"})
    first = asyncio.create_task(anext(stream))  # the request is sent when the iteration starts
    request = await fake.next_request()
    assert request.stream and orjson.loads(request.body) == {"prompt": "hi"}
    await fake.chunks(request, ["a", "b"])
    assert await first == "a"
    assert await anext(stream) == "b"
    third = asyncio.create_task(anext(stream))
    await fake.chunks(request, [{"c": [1, 2]}])
    assert await third == {"c": [1, 2]}
    await fake.end(request)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert feed_count(client) == 0


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (ReplyStatus.USER_ERROR, RemoteError),
        (ReplyStatus.DEADLINE_EXCEEDED, RequestTimeoutError),
        (ReplyStatus.BAD_REQUEST, BadRequestError),
    ],
)
async def test_an_error_after_chunks_is_raised_after_them_as_call_would_raise_it(
    client: AsyncClient, fake: FakeStreamReplica, status: ReplyStatus, error_class: type[StreamServeError]
) -> None:
    consumer = asyncio.create_task(collect(client.stream("tokens", None)))
    request = await fake.next_request()
    await fake.chunks(request, [1, 2])
    await fake.chunks(request, [3])
    await fake.fail(request, "ValueError", "chunk 3 cannot be made", status=status)
    got, error = await consumer
    assert got == [1, 2, 3]
    assert type(error) is error_class
    if isinstance(error, RemoteError):
        assert (error.error_type, error.message, error.replica_id) == (
            "ValueError",
            "chunk 3 cannot be made",
            fake.replica_id,
        )
    if status is ReplyStatus.BAD_REQUEST:
        assert str(error) == "chunk 3 cannot be made"
    assert feed_count(client) == 0


async def test_a_deadline_passing_while_the_consumer_dawdles_raises_after_the_chunks_that_came_before_it(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    chunks = client.stream("tokens", None, timeout=1.0)
    first = asyncio.create_task(anext(chunks))
    request = await fake.next_request()
    await fake.chunks(request, [1, 2, 3])
    assert await first == 1
    feed = chunks._feed
    assert feed is not None
    await wait_for_async(lambda: feed.expired or feed.failed, 10, "the deadline never passed")
    await fake.chunks(request, [4])  # after the deadline: too late
    got, error = await collect(chunks)
    assert got == [2, 3]
    assert isinstance(error, RequestTimeoutError) and "did not end within 1s" in str(error)
    assert feed_count(client) == 0


async def test_an_error_before_any_chunk_is_raised_by_the_first_step(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    consumer = asyncio.create_task(collect(client.stream("tokens", None)))
    await fake.fail(await fake.next_request(), "KeyError", "'prompt'")
    got, error = await consumer
    assert got == [] and isinstance(error, RemoteError) and error.error_type == "KeyError"


async def test_the_blocking_client_streams_the_same(settings: Settings, fake: FakeStreamReplica) -> None:
    with Client(settings=settings) as blocking:
        consumer = asyncio.create_task(asyncio.to_thread(collect_blocking, blocking.stream("tokens", [1])))
        request = await fake.next_request()
        assert request.stream and request.body == b"[1]"
        await fake.chunks(request, ["x", "y"])
        await fake.chunks(request, ["z"])
        await fake.fail(request, "RuntimeError", "out of tokens")
        got, error = await consumer
        assert got == ["x", "y", "z"]
        assert isinstance(error, RemoteError) and (error.error_type, error.message) == ("RuntimeError", "out of tokens")

        consumer = asyncio.create_task(asyncio.to_thread(collect_blocking, blocking.stream("tokens", None)))
        request = await fake.next_request()
        await fake.chunks(request, [None, 0.5])
        await fake.end(request)
        assert await consumer == ([None, 0.5], None)


async def test_closing_or_breaking_out_of_a_stream_forgets_the_request(
    settings: Settings, client: AsyncClient, fake: FakeStreamReplica
) -> None:
    async def first_only() -> Any:
        async for chunk in client.stream("tokens", None):
            return chunk  # leaves the iteration with chunks still coming

    task = asyncio.create_task(first_only())
    request = await fake.next_request()
    await fake.chunks(request, [1, 2, 3])
    assert await task == 1
    await wait_for_async(lambda: feed_count(client) == 0, 5, "the stream left with break is still followed")
    await fake.chunks(request, [4])  # later replies are dropped, quietly
    await fake.end(request)

    async with client.stream("tokens", None) as stream:
        step = asyncio.create_task(anext(stream))
        request = await fake.next_request()
        await fake.chunks(request, ["a", "b"])
        assert await step == "a"
        assert feed_count(client) == 1
    assert feed_count(client) == 0
    with pytest.raises(StopAsyncIteration):
        await anext(stream)

    with Client(settings=settings) as blocking:
        chunks, step, request = await blocking_stream_sent(blocking, fake)
        await fake.chunks(request, ["a", "b"])
        assert await step == "a"
        chunks.close()
        wait_for(lambda: feed_count(blocking._async) == 0, 5, "the closed blocking stream is still followed")
        with pytest.raises(StopIteration):
            next(chunks)


async def test_a_read_after_a_cancelled_read_says_the_stream_was_cancelled_not_that_it_ended(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    """A per-chunk timeout (asyncio.wait_for on a read) cancels the read, and so the request (docs/api.md): the next
    read says so, where it once raised StopAsyncIteration, as if the stream had ended well."""
    stream = client.stream("tokens", None)
    first = asyncio.create_task(anext(stream))
    request = await fake.next_request()
    await fake.chunks(request, ["a"])
    assert await first == "a"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), 0.01)  # no chunk comes: the read is cancelled
    for _ in range(2):
        with pytest.raises(RequestCancelledError, match="this stream was cancelled when a read of it was cancelled"):
            await anext(stream)
    assert feed_count(client) == 0

    unsent = client.stream("tokens", None)
    with pytest.raises(TimeoutError):  # the first read, before any chunk (or any answer of the fake's) comes
        await asyncio.wait_for(anext(unsent), 0.01)
    with pytest.raises(RequestCancelledError, match="this stream was cancelled"):
        await anext(unsent)


async def test_call_of_a_streaming_deployment_raises_the_replicas_error_naming_stream(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    call = asyncio.create_task(client.call("tokens", 1))
    request = await fake.next_request()
    assert not request.stream  # call() does not take a stream
    message = (
        "deployment 'tokens' streams its answer: call it with Client.stream() or AsyncClient.stream(), or over HTTP"
    )
    await fake.fail(request, "", message, status=ReplyStatus.BAD_REQUEST)
    with pytest.raises(BadRequestError) as raised:
        await call
    assert str(raised.value) == message


async def test_stream_of_a_unary_deployment_yields_its_one_result(client: AsyncClient, fake: FakeStreamReplica) -> None:
    consumer = asyncio.create_task(collect(client.stream("tokens", 7)))
    await fake.answer(await fake.next_request(), {"sum": 7})
    assert await consumer == ([{"sum": 7}], None)

    consumer = asyncio.create_task(collect(client.stream("tokens", None)))
    await fake.end(await fake.next_request())  # a generator that yielded nothing
    assert await consumer == ([], None)


async def test_a_stream_gets_only_its_own_chunks(client: AsyncClient, fake: FakeStreamReplica) -> None:
    one = asyncio.create_task(collect(client.stream("tokens", 1)))
    first = await fake.next_request()
    two = asyncio.create_task(collect(client.stream("tokens", 2)))
    second = await fake.next_request()
    assert client._replies is not None
    stranger = Reply(new_request_id(), ReplyStatus.CHUNK, fake.replica_id, b'"not yours"', count=1, window=4)
    await fake.redis.xadd(client._replies.name, stranger.encode())  # type: ignore[arg-type]
    await fake.chunks(first, ["1a"])
    await fake.chunks(second, ["2a", "2b"])
    await fake.chunks(first, ["1b"])
    await fake.end(second)
    await fake.end(first)
    assert await one == (["1a", "1b"], None)
    assert await two == (["2a", "2b"], None)


async def feed_values(feed: ChunkFeed) -> list[Any]:
    """A stream's chunks (decoded) up to its end, then closes it."""
    got: list[Any] = []
    try:
        while (chunk := await feed.next_chunk()) is not None:
            got.append(orjson.loads(chunk))
    finally:
        feed.close()
    return got


async def test_closing_the_client_cancels_the_streams_it_has_not_finished(
    settings: Settings, fake: FakeStreamReplica
) -> None:
    """A stream still open when its client closes (an iterator kept after ``break``, a script that ends) is
    cancelled: its generator would otherwise run on, or wait at its window until its deadline, for nobody."""
    client = AsyncClient(settings=settings)
    chunks = client.stream("tokens", None)
    step = asyncio.create_task(anext(chunks))
    request = await fake.next_request()
    await fake.chunks(request, [1, 2])
    assert await step == 1
    await client.aclose()
    told = [fields for _, fields in await fake.redis.xrange(fake.control) if fields.get(b"kind") == b"cancel"]
    assert [fields[b"id"] for fields in told] == [request.request_id.encode()]


async def test_a_stream_closed_while_another_task_reads_it_is_cancelled_for_that_reader(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    """A cancel button or a watchdog closing a stream: its reader got ProtocolError ("a message in Redis could not be
    decoded"), as if the data were corrupt."""
    stream = client.stream("tokens", None)
    first = asyncio.create_task(anext(stream))
    request = await fake.next_request()
    await fake.chunks(request, ["a"])
    assert await first == "a"
    reading = asyncio.create_task(anext(stream))
    await wait_for_async(lambda: asyncio.sleep(0, stream._reading), 5, "the read did not begin")
    await stream.aclose()
    with pytest.raises(RequestCancelledError, match="was closed"):
        await reading
    await wait_for_async(lambda: cancelled(fake, request), 5, "the closed stream's request was not cancelled")


async def test_a_stream_closed_before_its_first_chunk_cancels_its_request_at_once(
    settings: Settings, client: AsyncClient, fake: FakeStreamReplica
) -> None:
    """A cancel button pressed while the request waits in the queue or for its model: the close was lost (the first
    read, sending the request, took its stream back), and the generator ran to its end (found by a review)."""
    stream = client.stream("tokens", None)
    first = asyncio.create_task(anext(stream))
    request = await fake.next_request()
    await stream.aclose()
    with pytest.raises(RequestCancelledError, match="closed while its first read sent it"):
        await first
    await wait_for_async(lambda: cancelled(fake, request), 5, "the closed stream's request was not cancelled")
    with pytest.raises(StopAsyncIteration):
        await anext(stream)

    with Client(settings=settings) as blocking:
        chunks, reading, request = await blocking_stream_sent(blocking, fake)
        chunks.close()  # from another thread than its reader's
        with pytest.raises(RequestCancelledError):
            await reading
        await wait_for_async(lambda: cancelled(fake, request), 5, "the closed blocking stream was not cancelled")


async def test_a_second_read_at_once_is_refused_and_the_first_goes_on(
    settings: Settings, client: AsyncClient, fake: FakeStreamReplica
) -> None:
    """Two readers at once: the second one's wait replaced the first one's, which then waited past the stream's
    deadline (or, before the first chunk, the second saw the stream as over). A generator refuses it alike."""
    stream = client.stream("tokens", None)
    first, second = asyncio.create_task(anext(stream)), asyncio.create_task(anext(stream))
    with pytest.raises(ConcurrentReadError):
        await second
    request = await fake.next_request()
    await fake.chunks(request, ["a", "b"])
    assert await first == "a"
    assert await anext(stream) == "b"
    await stream.aclose()

    with Client(settings=settings) as blocking:
        chunks, request = await blocking_stream_at_its_first_chunk(blocking, fake)
        one = asyncio.create_task(asyncio.to_thread(next, chunks))  # waits: no chunk yet
        await wait_for_async(lambda: asyncio.sleep(0, chunks._chunks._reading), 5, "the read did not begin")
        with pytest.raises(ConcurrentReadError):
            await asyncio.to_thread(next, chunks)
        await fake.chunks(request, ["b"])
        assert await one == "b"  # the first read was left as it was, the stream open
        chunks.close()


async def test_a_blocking_stream_dropped_in_a_thread_of_its_own_is_closed_on_the_clients_loop(
    settings: Settings, fake: FakeStreamReplica
) -> None:
    """Client.close() while other threads start and read streams: a stream whose last reference went in its reader's
    thread was closed there, off the client's loop, and its cancel was lost ("no running event loop")."""
    with Client(settings=settings) as blocking:
        chunks, request = await blocking_stream_at_its_first_chunk(blocking, fake)
        held = [chunks._chunks]  # its async stream, without the iterator that closes it on the loop itself
        chunks._chunks = None  # type: ignore[assignment]
        del chunks
        await asyncio.to_thread(held.clear)  # the last reference goes in a thread with no event loop
        await wait_for_async(lambda: cancelled(fake, request), 5, "the dropped stream's request was not cancelled")


async def blocking_stream_sent(blocking: Client, fake: FakeStreamReplica) -> tuple[Any, asyncio.Task[Any], Request]:
    """A blocking client's stream of "tokens", its first read under way in a thread (which sent it), and its request
    as the replica took it."""
    chunks = blocking.stream("tokens", None)
    step = asyncio.create_task(asyncio.to_thread(next, chunks))
    return chunks, step, await fake.next_request()


async def blocking_stream_at_its_first_chunk(blocking: Client, fake: FakeStreamReplica) -> tuple[Any, Request]:
    """A blocking client's stream of "tokens", read (in a thread) to its first chunk, "a"; and its request."""
    chunks, step, request = await blocking_stream_sent(blocking, fake)
    await fake.chunks(request, ["a"])
    assert await step == "a"
    return chunks, request


async def cancelled(fake: FakeStreamReplica, request: Request) -> bool:
    """Whether the replica was told to cancel ``request``."""
    told = [fields for _, fields in await fake.redis.xrange(fake.control) if fields.get(b"kind") == b"cancel"]
    return request.request_id.encode() in [fields[b"id"] for fields in told]


async def test_a_call_that_reuses_a_request_id_gets_none_of_an_earlier_calls_chunks(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    # A caller streams request "again", leaves after the first chunk, and comes back with the same request id (as
    # an HTTP client that reconnects with its X-Request-ID does); the first run's chunks still come after that.
    first_call = asyncio.create_task(client.request("tokens", b"1", request_id="again", stream=True))
    earlier = await fake.next_request()
    await fake.chunks(earlier, ["earlier 0"])
    client.follow(await first_call).close()
    second_call = asyncio.create_task(client.request("tokens", b"2", request_id="again", stream=True))
    later = await fake.next_request()
    assert later.request_id == earlier.request_id and later.tag != earlier.tag
    await fake.chunks(earlier, ["earlier 1", "earlier 2"])  # sent before the cancel reached its replica
    await fake.end(earlier)
    await fake.chunks(later, ["later 0"], seq=0)  # (the fake counts what it sent by request id)
    await fake.chunks(later, ["later 1"], seq=1)
    await fake.end(later)
    first = await second_call
    assert first.request_id == "again"
    assert await feed_values(client.follow(first)) == ["later 0", "later 1"]


async def test_two_calls_with_one_request_id_at_once_each_get_their_own_chunks(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    calls = [asyncio.create_task(client.request("tokens", b"0", request_id="twin", stream=True)) for _ in range(2)]
    requests = [await fake.next_request(), await fake.next_request()]
    for n in range(3):
        for k, request in enumerate(requests):
            await fake.chunks(request, [f"{k}:{n}"], seq=n)  # (the fake counts what it sent by request id)
    for request in requests:
        await fake.end(request)
    feeds = {}
    for call in calls:
        first = await call
        feeds[orjson.loads(first.body.split(b"\n")[0])[0]] = client.follow(first)
    assert {k: await feed_values(feed) for k, feed in feeds.items()} == {
        "0": ["0:0", "0:1", "0:2"],
        "1": ["1:0", "1:1", "1:2"],
    }


async def test_a_reply_without_a_tag_from_an_earlier_releases_replica_reaches_its_call(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    call = asyncio.create_task(client.call("tokens", 1))
    request = await fake.next_request()
    assert request.tag  # this release's client tags its calls
    untagged = Reply(request.request_id, ReplyStatus.OK, fake.replica_id, b'{"sum": 1}')
    await fake.redis.xadd(request.reply_to, untagged.encode())  # type: ignore[arg-type]
    assert await call == {"sum": 1}


async def test_a_rerun_by_another_replica_continues_without_duplicates_and_progress_follows_it(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    stream = client.stream("tokens", None)
    step = asyncio.create_task(anext(stream))
    request = await fake.next_request()
    await fake.chunks(request, ["c0", "c1", "c2"])
    got = [await step, await anext(stream), await anext(stream)]
    await wait_for_async(lambda: reads_are(fake, request.request_id, [2]), 5)  # window 4: every 2 chunks

    # The replica dies; another one runs the generator again from chunk 0, under the same request id.
    other = fake.twin()
    await other.make_control_stream()
    await other.chunks(request, ["c0", "c1", "c2", "c3", "c4"], seq=0)
    await wait_for_async(lambda: reads_are(other, request.request_id, [3]), 5)  # told at once how far it is
    got += [await anext(stream), await anext(stream)]
    assert got == ["c0", "c1", "c2", "c3", "c4"]
    await wait_for_async(lambda: reads_are(other, request.request_id, [3, 5]), 5)
    await other.end(request)
    assert await collect(stream) == ([], None)
    assert await fake.reads(request) == [2]


async def reads_are(replica: FakeStreamReplica, request_id: str, expected: list[int]) -> bool:
    return [p.read for p in await replica.progress() if p.request_id == request_id] == expected


async def test_progress_is_reported_every_half_window_and_not_after_the_end(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    stream = client.stream("tokens", None)
    step = asyncio.create_task(anext(stream))
    request = await fake.next_request()
    await fake.chunks(request, list(range(10)))  # window 4: a report once 2 more chunks are taken
    assert await step == 0
    for taken in range(2, 11):
        assert await anext(stream) == taken - 1
        expected = list(range(2, taken + 1, 2))
        await wait_for_async(lambda e=expected: reads_are(fake, request.request_id, e), 5, f"reads {expected}")
    await fake.chunks(request, [10, 11, 12, 13])
    await fake.end(request)
    assert client._replies is not None
    feed = client._replies.feed(request.tag)
    assert feed is not None
    await wait_for_async(lambda: feed._final is not None, 5, "the end did not reach the client")
    assert (await collect(stream)) == ([10, 11, 12, 13], None)
    assert await fake.reads(request) == [2, 4, 6, 8, 10]  # the handler had ended: nobody to tell


async def test_a_slow_consumer_holds_the_generator_within_its_window(
    client: AsyncClient, fake: FakeStreamReplica
) -> None:
    fake.window = 8
    stream = client.stream("tokens", None)
    step = asyncio.create_task(anext(stream))
    request = await fake.next_request()
    generator = asyncio.create_task(fake.run_window(request, total=40))
    try:
        assert await step == 0
        assert client._replies is not None
        feed = client._replies.feed(request.tag)
        assert feed is not None
        rid = request.request_id
        await wait_for_async(lambda: fake.paused and fake.sent[rid] == 8, 5, lambda: f"sent {fake.sent}")
        assert feed.next_index - 1 <= 8  # what the client holds: at most a window
        for _ in range(3):  # 4 taken: reported, so the generator may go on to 4 + 8
            await anext(stream)
        await wait_for_async(lambda: fake.paused and fake.sent[rid] == 12, 5, lambda: f"sent {fake.sent}")
        assert feed.next_index - 4 <= 8
        rest = [chunk async for chunk in stream]
        assert rest == list(range(4, 40))
    finally:
        generator.cancel()


@pytest.mark.parametrize("where", ["call", "deployment"])
async def test_the_timeout_bounds_the_whole_stream(
    settings: Settings, client: AsyncClient, aredis: aioredis.Redis, where: str
) -> None:
    await deploy(settings, name="tokens", request_timeout_s=0.5 if where == "deployment" else 30)
    fake = await FakeStreamReplica.start(aredis, settings, "tokens", window=1000)
    stream = client.stream("tokens", None, timeout=0.5 if where == "call" else None)
    started = time.monotonic()
    consumer = asyncio.create_task(collect(stream))
    request = await fake.next_request()

    producer = asyncio.create_task(fake.send_forever(request, "tick"))  # a chunk every 20 ms, never an end
    try:
        got, error = await asyncio.wait_for(consumer, 5)  # the stream would go on for ever
        took = time.monotonic() - started
    finally:
        producer.cancel()
        await asyncio.wait([producer], timeout=15)  # ended here, not left to the event loop's close
    assert isinstance(error, RequestTimeoutError) and "0.5s" in str(error)
    assert len(got) >= 1 and set(got) == {"tick"}
    assert 0.5 <= took < 3
    assert feed_count(client) == 0


async def test_a_progress_message_that_fails_is_logged_and_the_stream_goes_on(
    client: AsyncClient, fake: FakeStreamReplica, caplog: pytest.LogCaptureFixture
) -> None:
    await fake.redis.delete(fake.control)
    await fake.redis.set(fake.control, b"not a stream")  # XADD to it fails (WRONGTYPE)
    consumer = asyncio.create_task(collect(client.stream("tokens", None)))
    request = await fake.next_request()
    with caplog.at_level(logging.WARNING, logger="streamserve.client.read_progress"):
        await fake.chunks(request, [1, 2, 3, 4])
        await wait_for_async(lambda: "how far a stream was read" in caplog.text, 5, "no warning logged")
        await fake.end(request)
        assert await consumer == ([1, 2, 3, 4], None)
    assert "WRONGTYPE" in caplog.text


def test_a_body_json_cannot_hold_is_refused_before_anything_is_sent(settings: Settings) -> None:
    with Client(settings=settings) as blocking, pytest.raises(BadRequestError, match="cannot be sent as JSON"):
        blocking.stream("tokens", float("nan"))
    assert isinstance(AsyncClient(settings=settings).stream("tokens", 1), ChunkStream)
