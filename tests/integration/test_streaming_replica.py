"""The replica's side of streaming, at the wire level: requests XADDed by hand, replies read with XREAD, progress
sent as a caller would (issue 28). The handlers are in tests/stream_deployments.py; an in-process replica runs them
against the real redis-server."""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any, cast

import orjson
import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import BadRequestError
from streamserve.wire.ids import new_caller_id, new_request_id
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import (
    CancelRequest,
    ChunkBatch,
    Fields,
    ReadProgress,
    Reply,
    ReplyStatus,
    Request,
    now_ms,
)
from streamserve.workers.chunk_batches import STREAM_BATCH_MAX_CHUNKS
from streamserve.workers.replica import Replica
from tests import stream_deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

NAME = "tokens"
MODULE = "tests.stream_deployments"
# Time for a generator that should be paused to run ahead if it were not (a check that nothing happens).
RUN_AHEAD_S = 0.3


class Caller:
    """A caller at the wire level: a reply stream of its own, requests XADDed by hand, replies read with XREAD."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self.redis = redis
        self.keys = settings.keys
        self.reply_to = settings.keys.reply_stream(new_caller_id())
        self._last: bytes | str = "0-0"
        self.tags: dict[str, str] = {}  # each request's tag, as a client gives one: every reply must echo it
        self.entries: dict[str, str] = {}  # each request's entry id in the request stream

    async def open(self) -> None:
        """Make the reply stream (replies are added with NOMKSTREAM, as to a real caller's)."""
        self._last = cast(bytes, await self.redis.xadd(self.reply_to, {"opened": "1"}))

    async def send(
        self, body: Any, *, method: str = "", stream: bool = True, timeout_s: float = 30.0, reply: bool = True
    ) -> str:
        request_id = new_request_id()
        deadline_ms = now_ms() + int(timeout_s * 1000)
        request = Request(request_id, self.reply_to if reply else "", deadline_ms, orjson.dumps(body), method)
        request.stream = stream
        request.tag = self.tags[request_id] = f"tag-{request_id[:6]}"
        entry_id = await self.redis.xadd(self.keys.requests(NAME), dict(request.encode()))
        self.entries[request_id] = self._text(entry_id)
        return request_id

    async def cancel(self, request_id: str, replica_id: str) -> None:
        """Tell the serving replica to stop ``request_id``, as a caller that gave up on it does."""
        await self.control(replica_id, dict(CancelRequest(self.entries[request_id], request_id).encode()))

    async def next_replies(self, timeout_s: float = 10.0) -> list[Reply]:
        """The replies that arrived since the last read, waiting up to ``timeout_s`` for one (chunks as CHUNK
        replies, one per part of each ChunkBatch)."""
        read = await self.redis.xread({self.reply_to: self._last}, block=max(1, int(timeout_s * 1000)))
        if not read:
            raise AssertionError(f"no reply within {timeout_s}s")
        replies = []
        for _stream, entries in read:
            for entry_id, fields in entries:
                self._last = entry_id
                if b"parts" in fields:
                    batch = ChunkBatch.decode(fields)
                    replies += [part.reply(batch.replica_id) for part in batch.parts]
                else:
                    replies.append(Reply.decode(fields))
        return replies

    async def waiting_replies(self) -> list[Fields]:
        """What is in the reply stream beyond what was read, without waiting."""
        entries = await self.redis.xrange(self.reply_to, min=f"({self._text(self._last)}")
        return [fields for _id, fields in entries]

    @staticmethod
    def _text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else value

    async def say_read(self, request_id: str, replica_id: str, read: int) -> None:
        """Tell the serving replica how far it has read, as a caller does."""
        await self.control(replica_id, dict(ReadProgress(request_id, read, self.tags.get(request_id, "")).encode()))

    async def control(self, replica_id: str, fields: dict[Any, Any]) -> None:
        key = self.keys.replica_control(NAME, replica_id)
        flat = itertools.chain.from_iterable(fields.items())
        await self.redis.execute_command("XADD", key, "NOMKSTREAM", "MAXLEN", "~", 10_000, "*", *flat)

    async def whole(
        self, request_id: str, *, report: bool = True, timeout_s: float = 20.0
    ) -> tuple[list[Reply], Reply]:
        """Every reply to ``request_id`` up to its final one; ``report``: say how far it has read whenever half a
        window is unreported, as the clients do."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        chunks: list[Reply] = []
        reported = 0
        while True:
            for reply in await self.next_replies(until - loop.time()):
                assert reply.request_id == request_id and reply.tag == self.tags[request_id], reply
                if reply.status is not ReplyStatus.CHUNK:
                    return chunks, reply
                chunks.append(reply)
                read = reply.seq + reply.count
                if report and read - reported >= max(1, reply.window // 2):
                    await self.say_read(request_id, reply.replica_id, read)
                    reported = read

    async def chunks_until(self, request_id: str, total: int) -> list[Reply]:
        """CHUNK replies until ``total`` more chunks have come (saying nothing about how far it has read)."""
        chunks: list[Reply] = []
        while sum(c.count for c in chunks) < total:
            for reply in await self.next_replies():
                assert reply.request_id == request_id and reply.status is ReplyStatus.CHUNK, reply
                assert reply.tag == self.tags[request_id], reply
                chunks.append(reply)
        return chunks


def values(chunks: list[Reply]) -> list[Any]:
    """The chunks' values in order, checking that each reply starts where the one before ended."""
    out: list[Any] = []
    for reply in chunks:
        assert reply.seq == len(out), f"a reply with seq {reply.seq} after {len(out)} chunks"
        lines = reply.body.split(b"\n")
        assert len(lines) == reply.count
        out += [orjson.loads(line) for line in lines]
    return out


@pytest.fixture(autouse=True)
def _fresh_records() -> None:
    stream_deployments.reset()


@pytest.fixture
async def caller(aredis: aioredis.Redis, settings: Settings) -> Caller:
    c = Caller(aredis, settings)
    await c.open()
    return c


async def serve(start_replica: StartReplica, attr: str, **fields: Any) -> Replica:
    return await start_replica(name=NAME, import_path=f"{MODULE}:{attr}", **fields)


async def test_chunks_arrive_in_order_with_seq_and_count_then_end(start_replica: StartReplica, caller: Caller) -> None:
    replica = await serve(start_replica, "count_to", max_unread_chunks=8)
    request_id = await caller.send(20)
    chunks, final = await caller.whole(request_id)
    assert values(chunks) == [{"i": i} for i in range(20)]
    assert final.status is ReplyStatus.END and final.seq == 20
    me = replica.replica_id.to_str()
    assert {c.window for c in chunks} == {8} and {c.replica_id for c in chunks} == {me} and final.replica_id == me


@pytest.mark.parametrize(
    ("attr", "method", "body", "expected"),
    [
        ("count_to", "", 3, [{"i": 0}, {"i": 1}, {"i": 2}]),
        ("acount_to", "", 3, [{"i": 0}, {"i": 1}, {"i": 2}]),
        ("Tokens", "", 3, ["t0", "t1", "t2"]),
        ("Tokens", "spell", "abc", ["a", "b", "c"]),
    ],
    ids=["sync-function", "async-function", "sync-__call__", "async-method"],
)
async def test_sync_and_async_generators_functions_and_methods_stream(
    start_replica: StartReplica, caller: Caller, attr: str, method: str, body: Any, expected: list[Any]
) -> None:
    await serve(start_replica, attr)
    chunks, final = await caller.whole(await caller.send(body, method=method))
    assert values(chunks) == expected
    assert final.status is ReplyStatus.END and final.seq == len(expected)


@pytest.mark.parametrize("attr", ["count_to", "acount_to"])
async def test_chunks_yielded_close_together_share_a_reply(
    start_replica: StartReplica, caller: Caller, attr: str
) -> None:
    await serve(start_replica, attr, max_unread_chunks=1000)
    chunks, final = await caller.whole(await caller.send(200))
    assert values(chunks) == [{"i": i} for i in range(200)]
    assert final.status is ReplyStatus.END and final.seq == 200
    assert len(chunks) <= 20, f"200 chunks yielded at once came in {len(chunks)} replies"
    assert max(c.count for c in chunks) <= STREAM_BATCH_MAX_CHUNKS


async def test_an_error_after_3_chunks_ends_the_stream_with_user_error_at_seq_3(
    start_replica: StartReplica, caller: Caller
) -> None:
    await serve(start_replica, "fail_after")
    chunks, final = await caller.whole(await caller.send(3))
    assert values(chunks) == [0, 1, 2]
    assert final.status is ReplyStatus.USER_ERROR and final.seq == 3
    assert final.error_type == "ValueError" and "boom after 3" in final.error_message


@pytest.mark.parametrize(("kind", "error_type"), [("nan", "ValueError"), ("set", "TypeError")])
async def test_a_chunk_json_cannot_hold_ends_the_stream_naming_its_index(
    start_replica: StartReplica, caller: Caller, kind: str, error_type: str
) -> None:
    await serve(start_replica, "nan_at_3")
    chunks, final = await caller.whole(await caller.send(kind))
    assert values(chunks) == [0, 1, 2]
    assert final.status is ReplyStatus.USER_ERROR and final.seq == 3
    assert final.error_type == error_type
    assert final.error_message.startswith("chunk 3 cannot be sent as JSON: ")
    assert f"nan_at_3:{kind}" in stream_deployments.FINALLY_RAN  # the generator was closed, not left suspended


async def test_a_chunk_above_max_response_bytes_ends_the_stream_naming_its_index(
    start_replica: StartReplica, caller: Caller
) -> None:
    await serve(start_replica, "sized", max_response_bytes=1000)
    chunks, final = await caller.whole(await caller.send([10, 5000, 10]))
    assert values(chunks) == ["x" * 10]
    assert final.status is ReplyStatus.USER_ERROR and final.seq == 1
    assert final.error_type == "ResponseTooLargeError"
    assert final.error_message == "chunk 1 is 5002 bytes of JSON, above max_response_bytes (1000)"


async def test_the_deadline_closes_an_async_generator_mid_stream(start_replica: StartReplica, caller: Caller) -> None:
    await serve(start_replica, "async_stuck_after")
    loop = asyncio.get_running_loop()
    started = loop.time()
    chunks, final = await caller.whole(await caller.send(2, timeout_s=1.0))
    assert final.status is ReplyStatus.DEADLINE_EXCEEDED and final.seq == 2
    assert values(chunks) == [0, 1]
    assert loop.time() - started < 5  # at the deadline, not after the generator's minute
    assert "async_stuck" in stream_deployments.FINALLY_RAN


async def test_the_deadline_closes_a_sync_generator_at_its_next_yield(
    start_replica: StartReplica, caller: Caller
) -> None:
    await serve(start_replica, "sync_slow")
    loop = asyncio.get_running_loop()
    started = loop.time()
    chunks, final = await caller.whole(await caller.send(0.05, timeout_s=1.0))
    assert final.status is ReplyStatus.DEADLINE_EXCEEDED
    assert loop.time() - started < 5
    assert "sync_slow" in stream_deployments.FINALLY_RAN
    assert final.seq == stream_deployments.YIELDED["sync_slow"] == len(values(chunks)) > 0


async def test_a_cancel_after_the_deadline_leaves_a_sync_generator_ended_by_its_deadline(
    start_replica: StartReplica, caller: Caller, aredis: aioredis.Redis, settings: Settings
) -> None:
    """A caller gives up at the deadline and cancels (the gateway does, with its 504), while the sync generator runs
    on to its next yield: its deadline stopped it, and it is counted so, not as cancelled."""
    await serve(start_replica, "sync_slow")
    sent_ms = now_ms()
    request_id = await caller.send(3.0, timeout_s=0.5)  # a chunk, then 3 s to its next yield
    [first] = await caller.chunks_until(request_id, 1)
    await wait_for_async(lambda: now_ms() > sent_ms + 600, 5, "the deadline never passed")
    await caller.cancel(request_id, first.replica_id)

    async def outcomes() -> dict[bytes, bytes]:
        totals = await aredis.hgetall(settings.keys.metrics(NAME))
        return {k: v for k, v in totals.items() if k.startswith(b"handled_requests_total|")}

    await wait_for_async(outcomes, 15, "the stream's outcome never reached Redis")
    assert await outcomes() == {b"handled_requests_total|outcome=deadline_exceeded": b"1"}


async def test_a_sync_generator_that_returns_once_cancelled_says_so_at_its_deadline(
    start_replica: StartReplica, caller: Caller, aredis: aioredis.Redis, settings: Settings
) -> None:
    """It stopped short of what it would have made because its deadline passed: counted as the deadline and a
    cancellation while running, as a generator the deadline closes at a yield is, not as a stream that ended well."""
    await serve(start_replica, "sync_until_cancelled")
    chunks, final = await caller.whole(await caller.send(0.02, timeout_s=0.5))
    assert final.status is ReplyStatus.DEADLINE_EXCEEDED and values(chunks) == [0]
    assert "sync_until_cancelled" in stream_deployments.FINALLY_RAN

    async def counted() -> dict[bytes, bytes]:
        totals = await aredis.hgetall(settings.keys.metrics(NAME))
        return {k: v for k, v in totals.items() if k.startswith((b"handled_requests_total|", b"cancelled_"))}

    await wait_for_async(counted, 15, "the stream's outcome never reached Redis")
    assert await counted() == {
        b"handled_requests_total|outcome=deadline_exceeded": b"1",
        b"cancelled_requests_total|stage=running": b"1",
    }


@pytest.mark.parametrize("tag", ["sync_flow", "async_flow"])
async def test_a_stream_paused_by_its_caller_still_ends_at_its_deadline(
    start_replica: StartReplica, caller: Caller, tag: str
) -> None:
    await serve(start_replica, tag, max_unread_chunks=2)
    chunks, final = await caller.whole(await caller.send(100, timeout_s=1.0), report=False)
    assert values(chunks) == [0, 1]
    assert final.status is ReplyStatus.DEADLINE_EXCEEDED and final.seq == 2
    await wait_for_async(lambda: tag in stream_deployments.FINALLY_RAN, 5, "the paused generator was never closed")


@pytest.mark.parametrize("tag", ["sync_flow", "async_flow"])
async def test_a_stream_pauses_max_unread_chunks_ahead_of_what_its_caller_has_read(
    start_replica: StartReplica, caller: Caller, tag: str
) -> None:
    replica = await serve(start_replica, tag, max_unread_chunks=4, graceful_shutdown_timeout_s=1)
    me = replica.replica_id.to_str()
    request_id = await caller.send(100)
    yielded = stream_deployments.YIELDED

    chunks = await caller.chunks_until(request_id, 4)
    await asyncio.sleep(RUN_AHEAD_S)  # nothing must happen: time to run ahead if it could
    assert 4 <= yielded[tag] <= 5, f"the generator went on to chunk {yielded[tag]} with none read"
    assert await caller.waiting_replies() == []

    # What a caller must not be able to break it with: an unknown kind, another request, a malformed message.
    await caller.control(me, {"v": "1", "kind": "no-such-kind", "id": request_id})
    await caller.say_read(new_request_id(), me, 100)
    await caller.control(me, {"v": "1", "kind": "read", "id": request_id, "read": "lots"})
    await caller.say_read(request_id, me, 4)
    chunks += await caller.chunks_until(request_id, 4)
    await asyncio.sleep(RUN_AHEAD_S)
    assert 8 <= yielded[tag] <= 9, f"the generator went on to chunk {yielded[tag]} with 4 read"
    assert await caller.waiting_replies() == []

    await caller.say_read(request_id, me, 8)
    rest, final = await caller.whole(request_id)
    assert values(chunks + rest) == list(range(100))
    assert final.status is ReplyStatus.END and final.seq == 100


async def test_streams_that_share_a_request_id_are_told_apart_by_their_tags(
    start_replica: StartReplica, caller: Caller
) -> None:
    """Two callers' streams with one request id on one replica, each paused at its window of 2 until its own caller
    says how far it read: each gets its own chunks and end, and each caller's progress moves its own stream."""
    replica = await serve(start_replica, "count_to", max_unread_chunks=2)
    me = replica.replica_id.to_str()
    request_id = new_request_id()
    for tag in ("first", "second"):
        request = Request(request_id, caller.reply_to, now_ms() + 30_000, b"6", stream=True, tag=tag)
        await caller.redis.xadd(caller.keys.requests(NAME), dict(request.encode()))
    got: dict[str, list[Any]] = {"first": [], "second": []}
    ended: dict[str, Reply] = {}
    loop = asyncio.get_running_loop()
    until = loop.time() + 20
    while len(ended) < 2:
        for reply in await caller.next_replies(until - loop.time()):
            assert reply.request_id == request_id and reply.tag in got, reply
            if reply.status is not ReplyStatus.CHUNK:
                ended[reply.tag] = reply
                continue
            got[reply.tag] += [orjson.loads(line) for line in reply.body.split(b"\n")]
            progress = ReadProgress(request_id, len(got[reply.tag]), reply.tag)
            await caller.control(me, dict(progress.encode()))
    assert got == {"first": [{"i": i} for i in range(6)], "second": [{"i": i} for i in range(6)]}
    assert {tag: (final.status, final.seq) for tag, final in ended.items()} == {
        "first": (ReplyStatus.END, 6),
        "second": (ReplyStatus.END, 6),
    }


async def test_a_streaming_handler_called_without_the_stream_flag_is_refused_naming_stream(
    start_replica: StartReplica, caller: Caller
) -> None:
    await serve(start_replica, "count_to")
    await caller.send(3, stream=False)
    [reply] = await caller.next_replies()
    assert reply.status is ReplyStatus.BAD_REQUEST
    assert "deployment 'tokens' streams its answer: call it with Client.stream() or AsyncClient.stream()" in (
        reply.error_message
    )
    assert stream_deployments.STARTED["count_to"] == 0  # not run


async def test_a_call_with_the_key_of_a_stream_is_told_to_stream(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    """call() with an idempotency key whose run was a stream (its chunks kept for the retries) gets the replica's
    BadRequestError naming stream(), as a call without a key does."""
    await serve(start_replica, "count_to")
    assert [chunk async for chunk in client.stream(NAME, 2, idempotency_key="streamed")] == [{"i": 0}, {"i": 1}]
    expected = f"deployment {NAME!r} streams its answer: call it with Client.stream() or AsyncClient.stream()"
    with pytest.raises(BadRequestError, match=re.escape(expected)):
        await client.call(NAME, 2, idempotency_key="streamed")
    assert stream_deployments.STARTED["count_to"] == 1


@pytest.mark.parametrize("attr", ["count_to", "acount_to"])
async def test_a_send_to_a_streaming_deployment_runs_it_to_its_end(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings, attr: str
) -> None:
    """send() (and an endpoint's shadow copy) takes no answer: the generator runs all the same, never paused for a
    reader (more chunks than max_unread_chunks), and its request is done with; with an idempotency key, a stream
    sent later with the key gets its chunks."""
    await serve(start_replica, attr)
    await client.send(NAME, 200)

    async def ended() -> bool:
        return stream_deployments.ENDED[attr] == 1

    await wait_for_async(ended, 10, "the generator did not run to its end")
    requests = settings.keys.requests(NAME)

    async def acked() -> bool:
        return (await aredis.xpending(requests, CONSUMER_GROUP))["pending"] == 0

    await wait_for_async(acked, 10, "the request was not acknowledged")
    await client.send(NAME, 3, idempotency_key="sent-once")
    await wait_for_async(lambda: _ended_twice(attr), 10, "the keyed send did not run")
    assert [chunk async for chunk in client.stream(NAME, 3, idempotency_key="sent-once")] == [
        {"i": i} for i in range(3)
    ]
    assert stream_deployments.STARTED[attr] == 2


async def _ended_twice(attr: str) -> bool:
    return stream_deployments.ENDED[attr] == 2


async def test_a_unary_handler_answers_as_ever_when_asked_for_a_stream(
    start_replica: StartReplica, caller: Caller
) -> None:
    await serve(start_replica, "Tokens")
    await caller.send({"a": 1}, method="unary")
    [entry] = await wait_for_replies(caller, 1)
    assert entry[b"status"] == b"ok" and orjson.loads(entry[b"body"]) == {"a": 1}
    assert not {b"seq", b"count", b"window"} & set(entry)


async def test_the_control_stream_lives_as_long_as_its_replica(
    start_replica: StartReplica, aredis: aioredis.Redis, settings: Settings
) -> None:
    replica = await serve(start_replica, "count_to")
    key = settings.keys.replica_control(NAME, replica.replica_id.to_str())
    assert await aredis.exists(key) == 1
    assert await aredis.pttl(key) > 0  # one left by a replica killed with -9 expires
    replica.request_stop()
    await wait_for_async(lambda: _gone(aredis, key), 10, "the control stream outlived its replica")


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    return await redis.exists(key) == 0


async def wait_for_replies(caller: Caller, count: int) -> list[Fields]:
    """The raw fields of the next ``count`` replies."""

    async def arrived() -> bool:
        return len(await caller.waiting_replies()) >= count

    await wait_for_async(arrived, 10, f"{count} replies never arrived")
    return (await caller.waiting_replies())[:count]


async def test_a_stream_finishes_within_the_drain_and_one_past_it_stays_pending(
    start_replica: StartReplica, caller: Caller, aredis: aioredis.Redis, settings: Settings
) -> None:
    replica = await serve(start_replica, "sync_flow", max_unread_chunks=2, graceful_shutdown_timeout_s=30)
    me = replica.replica_id.to_str()
    request_id = await caller.send(10)
    await caller.chunks_until(request_id, 2)
    replica.request_stop()
    await caller.say_read(request_id, me, 2)  # the drain lets it go on: it reads on as the replica drains
    _rest, final = await caller.whole(request_id)
    assert final.status is ReplyStatus.END and final.seq == 10
    key = settings.keys.replica_control(NAME, me)
    await wait_for_async(lambda: _gone(aredis, key), 10, "the replica did not exit")
    assert (await aredis.xpending(settings.keys.requests(NAME), CONSUMER_GROUP))["pending"] == 0


@pytest.mark.parametrize("tag", ["sync_flow", "async_flow"])
async def test_a_stream_still_running_past_the_drain_is_left_pending_and_closed(
    start_replica: StartReplica, caller: Caller, aredis: aioredis.Redis, settings: Settings, tag: str
) -> None:
    replica = await serve(start_replica, tag, max_unread_chunks=2, graceful_shutdown_timeout_s=0.2)
    request_id = await caller.send(10)
    await caller.chunks_until(request_id, 2)
    replica.request_stop()
    key = settings.keys.replica_control(NAME, replica.replica_id.to_str())
    await wait_for_async(lambda: _gone(aredis, key), 10, "the replica did not exit")
    assert (await aredis.xpending(settings.keys.requests(NAME), CONSUMER_GROUP))["pending"] == 1
    assert await caller.waiting_replies() == []  # no final reply: another replica serves it again
    await wait_for_async(lambda: tag in stream_deployments.FINALLY_RAN, 5, "the generator was never closed")


async def test_streams_count_their_chunks_and_time_to_first_chunk(
    start_replica: StartReplica, caller: Caller, aredis: aioredis.Redis, settings: Settings
) -> None:
    await serve(start_replica, "count_to")
    _chunks, final = await caller.whole(await caller.send(10))
    assert final.status is ReplyStatus.END

    async def counted() -> bool:
        totals = await aredis.hgetall(settings.keys.metrics(NAME))
        first = sum(int(v) for k, v in totals.items() if k.startswith(b"stream_time_to_first_chunk_seconds|le="))
        return totals.get(b"stream_chunks_total") == b"10" and first == 1

    await wait_for_async(counted, 10, "the stream's metrics never reached Redis")
    totals = await aredis.hgetall(settings.keys.metrics(NAME))
    assert totals[b"handled_requests_total|outcome=ok"] == b"1"


async def test_flow_control_survives_redis_dropping_every_connection_and_the_control_stream(
    start_replica: StartReplica, caller: Caller, aredis: aioredis.Redis, settings: Settings
) -> None:
    replica = await serve(start_replica, "sync_flow", max_unread_chunks=4, graceful_shutdown_timeout_s=1)
    me = replica.replica_id.to_str()
    key = settings.keys.replica_control(NAME, me)
    request_id = await caller.send(20)
    chunks = await caller.chunks_until(request_id, 4)
    await aredis.delete(key)  # as a Redis that restarted empty would have it
    killed = 0
    for kind in ("normal", "pubsub"):
        killed += await aredis.execute_command("CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes")
    assert killed >= 1

    async def made_again() -> bool:
        return await aredis.exists(key) == 1

    await wait_for_async(made_again, 10, "the replica never made its control stream again")
    await caller.say_read(request_id, me, 4)
    rest, final = await caller.whole(request_id)
    assert values(chunks + rest) == list(range(20))
    assert final.status is ReplyStatus.END and final.seq == 20
