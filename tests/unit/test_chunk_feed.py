"""ChunkFeed: one stream's chunks between the reply reader and the consumer (issue 28), without Redis."""

from __future__ import annotations

import asyncio

import pytest

from streamserve.app.streaming_response import wants_sse
from streamserve.client.chunk_feed import ChunkFeed
from streamserve.wire.errors import ProtocolError, RemoteError, RequestTimeoutError
from streamserve.wire.messages import Reply, ReplyStatus


def chunk(seq: int, *values: bytes, replica: str = "tokens#a", window: int = 4) -> Reply:
    return Reply("r1", ReplyStatus.CHUNK, replica, b"\n".join(values), seq=seq, count=len(values), window=window)


def end(seq: int, replica: str = "tokens#a") -> Reply:
    return Reply("r1", ReplyStatus.END, replica, seq=seq)


def reporting_feed() -> tuple[ChunkFeed, list[tuple[str, int]]]:
    feed = ChunkFeed("r1")
    reports: list[tuple[str, int]] = []
    feed.report = lambda replica, read: reports.append((replica, read))
    return feed, reports


async def test_chunks_come_out_in_order_one_by_one_or_all_at_once() -> None:
    feed = ChunkFeed("r1")
    feed.add(chunk(0, b"1", b"2", b"3"))
    feed.add(chunk(3, b"4"))
    assert await feed.next_chunk() == b"1"
    assert await feed.next_batch() == b"2\n3\n4"  # the rest of the first message and the next one
    feed.add(end(4))
    assert await feed.next_batch() is None
    assert await feed.next_chunk() is None


async def test_an_error_comes_after_the_chunks_before_it() -> None:
    feed = ChunkFeed("r1")
    feed.add(chunk(0, b"1"))
    feed.add(Reply("r1", ReplyStatus.USER_ERROR, "tokens#a", error_type="ValueError", error_message="boom", seq=1))
    assert await feed.next_chunk() == b"1"
    with pytest.raises(RemoteError, match="ValueError: boom"):
        await feed.next_chunk()


async def test_a_rerun_from_chunk_0_gives_only_what_is_new_and_progress_goes_to_the_new_replica() -> None:
    feed, reports = reporting_feed()
    feed.add(chunk(0, b"a", b"b", b"c"))
    assert [await feed.next_chunk() for _ in range(3)] == [b"a", b"b", b"c"]
    assert reports == [("tokens#a", 2)]  # window 4: every 2 taken
    feed.add(chunk(0, b"a", b"b", replica="tokens#b"))  # all duplicates; the new replica is told at once
    assert reports == [("tokens#a", 2), ("tokens#b", 3)]
    feed.add(chunk(2, b"c", b"d", b"e", replica="tokens#b"))
    assert await feed.next_batch() == b"d\ne"
    assert reports[-1] == ("tokens#b", 5)
    feed.add(end(5, replica="tokens#b"))
    assert await feed.next_batch() is None


async def test_no_progress_is_reported_once_the_stream_has_ended() -> None:
    feed, reports = reporting_feed()
    feed.add(chunk(0, b"1", b"2", b"3", b"4"))
    feed.add(end(4))
    assert await feed.next_batch() == b"1\n2\n3\n4"
    assert reports == []


async def test_a_gap_or_an_end_beyond_what_came_is_a_protocol_error_never_a_silent_end() -> None:
    feed = ChunkFeed("r1")
    feed.add(chunk(0, b"1"))
    feed.add(chunk(2, b"3"))
    with pytest.raises(ProtocolError, match="skipped chunks 1 to 1"):
        await feed.next_chunk()
    feed = ChunkFeed("r1")
    feed.add(chunk(0, b"1"))
    feed.add(end(2))
    with pytest.raises(ProtocolError, match="ended after 2 chunks, 1 came"):
        await feed.next_batch()


async def test_a_failure_ends_the_stream_at_once_and_closing_forgets_it() -> None:
    feed = ChunkFeed("r1")
    closed: list[bool] = []
    feed.on_close = lambda: closed.append(True)
    feed.add(chunk(0, b"1", b"2"))
    feed.fail(RequestTimeoutError("too late"))
    with pytest.raises(RequestTimeoutError):
        await feed.next_chunk()
    feed.add(chunk(2, b"3"))  # ignored
    feed.close()
    feed.close()
    assert closed == [True]


@pytest.mark.parametrize(
    ("accept", "sse"),
    [
        ([], False),
        (["application/x-ndjson"], False),
        (["text/event-stream"], True),
        (["application/json, Text/Event-Stream; q=0.5"], True),
        (["text/event-stream;q=0"], False),
        (["*/*"], False),
        # Weighed against NDJSON: the higher weight wins, SSE on a tie.
        (["application/x-ndjson, text/event-stream;q=0.1"], False),
        (["text/event-stream;q=0.1, application/x-ndjson"], False),
        (["text/event-stream, application/x-ndjson"], True),
        (["application/x-ndjson;q=0.5", "text/event-stream;q=0.8"], True),
        # A malformed weight: the range counts as not named.
        (["text/event-stream; q=abc"], False),
        (["text/event-stream;q=1.5"], False),
        (["text/event-stream;q=0.1234"], False),
        (["text/event-stream;q=1.000"], True),
    ],
)
def test_sse_is_chosen_only_when_accept_prefers_it(accept: list[str], sse: bool) -> None:
    assert wants_sse(accept) is sse


async def test_chunks_for_a_waiting_consumer_with_a_sink_go_to_it_in_one_write_per_read_without_waking_it() -> None:
    feed, reports = reporting_feed()
    written: list[bytes] = []
    socket_takes = [True]

    def sink(body: bytes) -> bool:
        if socket_takes[0]:
            written.append(body)
        return socket_takes[0]

    feed.sink = sink
    consumer = asyncio.create_task(feed.next_batch())
    await asyncio.sleep(0)  # it waits for chunks
    assert feed.add_chunks("tokens#a", 4, 0, 1, b"1") is True  # flush this feed once the read is in
    assert feed.add_chunks("tokens#a", 4, 1, 2, b"2\n3") is False  # (due already)
    feed.flush()
    assert written == [b"1\n2\n3"]  # one write for the read
    assert reports == [("tokens#a", 3)]  # taken: its replica is told as for chunks a consumer took
    await asyncio.sleep(0)
    assert not consumer.done()  # never woken

    socket_takes[0] = False  # the client reads slowly: the consumer writes (and waits) itself
    assert feed.add_chunks("tokens#a", 4, 3, 1, b"4") is True
    feed.flush()
    assert await consumer == b"4"
    assert written == [b"1\n2\n3"]


async def test_a_consumer_that_is_busy_takes_what_came_itself() -> None:
    feed = ChunkFeed("r1")
    feed.sink = lambda _body: pytest.fail("written while the consumer was busy")  # type: ignore[misc]
    assert feed.add_chunks("tokens#a", 4, 0, 1, b"1") is False  # nobody waits: held for the consumer
    feed.flush()
    assert await feed.next_batch() == b"1"
