"""How a replica sends a stream's chunks, with Redis's answers in the test's hands (no Redis): one batch on its way
per caller at a time, holding the chunks of every stream that has some ready; the final reply only once every chunk
is in Redis; a refused batch sent again from the same seq; given up at the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from streamserve.runtime.request_scope import RequestScope
from streamserve.transport.pipelining import Command
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.messages import ChunkBatch, Reply, ReplyStatus, Request, now_ms
from streamserve.workers.loader import Handler
from streamserve.workers.streaming import Streams
from streamserve.workers.threads import HandlerThreads
from tests.harness.waiting import wait_for_async

CONFIG = DeploymentConfig.model_validate({"name": "s", "import_path": "tests.stream_deployments:acount_to"})


class HeldPipeliner:
    """A Pipeliner whose round trips the test answers by hand: ``sent`` holds each batch (and the stream it went to)
    and its future."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, ChunkBatch, asyncio.Future[list[Any]]]] = []

    def execute(self, *commands: Command) -> asyncio.Future[list[Any]]:
        [command] = commands
        assert command[0] == "XADD" and command[2] == "NOMKSTREAM"
        flat = command[7:]
        fields = {_bytes(k): _bytes(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.sent.append((_text(command[1]), ChunkBatch.decode(fields), future))
        return future

    def chunks(self) -> list[tuple[int, int]]:
        """(seq, count) of each batch sent so far, each of one stream's chunks."""
        found = []
        for _to, batch, _ in self.sent:
            [part] = batch.parts
            found.append((part.seq, part.count))
        return found

    def parts(self, index: int) -> list[tuple[str, int, int]]:
        """(request id, seq, count) of each part of batch ``index``."""
        return [(part.request_id, part.seq, part.count) for part in self.sent[index][1].parts]

    def answer(self, index: int, result: Any = b"1-0") -> None:
        self.sent[index][2].set_result([result])


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def user_error(request: Request, exc: BaseException, context: str) -> Reply:
    return Reply(request.request_id, ReplyStatus.USER_ERROR, "r#1", error_message=context + str(exc))


def streams_on(pipeliner: HeldPipeliner) -> Streams:
    return Streams(
        pipeliner=pipeliner,  # type: ignore[arg-type]
        threads=HandlerThreads(1),
        replica_id="r#1",
        deployment="s",
        figures=None,
        user_error=user_error,
    )


async def start(
    fn: Any,
    body: Any,
    pipeliner: HeldPipeliner,
    deadline_ms: int = 0,
    *,
    streams: Streams | None = None,
    request_id: str = "req-1",
    reply_to: str = "replies",
) -> asyncio.Future[Reply]:
    streams = streams or streams_on(pipeliner)
    request = Request(request_id, reply_to, deadline_ms, b"null", stream=True, tag=f"tag-{request_id}")
    scope = RequestScope(request.request_id, deadline_ms)
    return streams.start(request, Handler(fn, is_async=True, is_stream=True), body, CONFIG, scope).outcome


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def three_then_gate(gate: asyncio.Event) -> AsyncIterator[int]:
    yield 0
    await gate.wait()
    yield 1
    yield 2


async def test_one_chunk_reply_is_on_its_way_at_a_time_and_the_final_one_waits_for_it() -> None:
    pipeliner, gate = HeldPipeliner(), asyncio.Event()
    outcome = await start(lambda _body: three_then_gate(gate), None, pipeliner)
    await turns()
    assert pipeliner.chunks() == [(0, 1)]
    gate.set()
    await turns()
    assert pipeliner.chunks() == [(0, 1)]  # chunks 1 and 2 wait for the first reply to be in Redis
    assert not outcome.done()  # the generator has ended, but its chunks are not all in Redis
    pipeliner.answer(0)
    await turns()
    assert pipeliner.chunks() == [(0, 1), (1, 2)]
    assert not outcome.done()
    pipeliner.answer(1)
    await turns()
    final = outcome.result()
    assert final.status is ReplyStatus.END and final.seq == 3


async def two() -> AsyncIterator[int]:
    yield 0
    yield 1


async def test_chunks_redis_refused_are_sent_again_from_the_same_seq() -> None:
    pipeliner, gate = HeldPipeliner(), asyncio.Event()
    outcome = await start(lambda _body: three_then_gate(gate), None, pipeliner)
    await turns()
    assert pipeliner.chunks() == [(0, 1)]  # the first chunk goes at once, alone
    pipeliner.sent[0][2].set_exception(RedisConnectionError("Redis is away"))
    gate.set()  # chunks 1 and 2 come while the first waits to be sent again
    await wait_for_async(lambda: len(pipeliner.sent) == 2, 5, "the refused chunk was never sent again")
    assert pipeliner.chunks() == [(0, 1), (0, 3)]  # from chunk 0 again, with those that came meanwhile
    assert not outcome.done()
    pipeliner.answer(1)
    await turns()
    assert outcome.result().status is ReplyStatus.END and outcome.result().seq == 3


async def test_the_chunks_of_streams_for_one_caller_go_in_one_batch_and_other_callers_get_their_own() -> None:
    pipeliner, gate = HeldPipeliner(), asyncio.Event()
    streams = streams_on(pipeliner)
    outcomes = [
        await start(lambda _body: three_then_gate(gate), None, pipeliner, streams=streams, request_id=rid, reply_to=to)
        for rid, to in [("a", "replies"), ("b", "replies"), ("c", "others")]
    ]
    await turns()
    # a's first chunk went at once; b's waits for that batch to land; c's caller has a batch of its own.
    assert [(to, pipeliner.parts(i)) for i, (to, _, _) in enumerate(pipeliner.sent)] == [
        ("replies", [("a", 0, 1)]),
        ("others", [("c", 0, 1)]),
    ]
    gate.set()
    await turns()
    pipeliner.answer(0)
    await turns()
    assert pipeliner.parts(2) == [("b", 0, 3), ("a", 1, 2)]  # everything ready for that caller, in one entry
    assert {part.tag for part in pipeliner.sent[2][1].parts} == {"tag-a", "tag-b"}
    pipeliner.answer(1)
    pipeliner.answer(2)
    await turns()
    assert pipeliner.parts(3) == [("c", 1, 2)]
    pipeliner.answer(3)
    await turns()
    assert [outcome.result().seq for outcome in outcomes] == [3, 3, 3]


async def test_chunks_redis_never_took_end_the_stream_at_its_deadline_counting_only_those_it_took() -> None:
    pipeliner, gate = HeldPipeliner(), asyncio.Event()
    outcome = await start(lambda _body: three_then_gate(gate), None, pipeliner, deadline_ms=now_ms() + 300)
    await turns()
    pipeliner.answer(0)  # chunk 0 is in Redis
    gate.set()
    await turns()
    assert pipeliner.chunks() == [(0, 1), (1, 2)]

    async def refuse_until_given_up() -> bool:
        for _to, _batch, future in pipeliner.sent:
            if not future.done():
                future.set_result([ResponseError("OOM command not allowed when used memory > maxmemory")])
        return outcome.done()

    await wait_for_async(refuse_until_given_up, 5, "the stream never gave up")
    final = outcome.result()
    assert final.status is ReplyStatus.DEADLINE_EXCEEDED and final.seq == 1


async def test_a_stream_cancelled_before_its_generator_took_a_step_still_ends() -> None:
    """Its caller left at once (an HTTP client that closed right after its request): the cancel cancelled the
    generator's task before it ran, and the stream took that for the replica closing it: no outcome, its entry left
    pending under a live replica for good, counted in flight."""
    pipeliner = HeldPipeliner()
    request = Request("req-1", "replies", 0, b"null", stream=True, tag="tag-req-1")
    scope = RequestScope(request.request_id, 0)
    stream = streams_on(pipeliner).start(request, Handler(lambda _body: two(), True, True), None, CONFIG, scope)
    assert scope.stop is not None
    scope.stop()  # in the same turn: the generator's task has not run yet
    await turns()
    assert stream.outcome.done() and not stream.outcome.cancelled(), "the stream ended without an outcome"
    assert stream.outcome.result().status is ReplyStatus.CANCELLED
    assert pipeliner.sent == []
