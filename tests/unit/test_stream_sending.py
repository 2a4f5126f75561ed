"""How a replica sends a stream's replies, with Redis's answers in the test's hands (no Redis): one CHUNK reply on
its way at a time, the final reply only once every chunk is in Redis, a refused reply sent again with the same seq,
and given up at the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from streamserve.runtime.request_scope import RequestScope
from streamserve.transport.pipelining import Command
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms
from streamserve.workers.loader import Handler
from streamserve.workers.streaming import Streams
from streamserve.workers.threads import HandlerThreads
from tests.harness.waiting import wait_for_async

CONFIG = DeploymentConfig.model_validate({"name": "s", "import_path": "tests.stream_deployments:acount_to"})


class HeldPipeliner:
    """A Pipeliner whose round trips the test answers by hand: ``sent`` holds each reply and its future."""

    def __init__(self) -> None:
        self.sent: list[tuple[Reply, asyncio.Future[list[Any]]]] = []

    def execute(self, *commands: Command) -> asyncio.Future[list[Any]]:
        [command] = commands
        assert command[:3] == ("XADD", "replies", "NOMKSTREAM")
        flat = command[7:]
        fields = {_bytes(k): _bytes(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.sent.append((Reply.decode(fields), future))
        return future

    def chunks(self) -> list[tuple[int, int]]:
        """(seq, count) of each CHUNK reply sent so far."""
        return [(reply.seq, reply.count) for reply, _ in self.sent]

    def answer(self, index: int, result: Any = b"1-0") -> None:
        self.sent[index][1].set_result([result])


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def user_error(request: Request, exc: BaseException, context: str) -> Reply:
    return Reply(request.request_id, ReplyStatus.USER_ERROR, "r#1", error_message=context + str(exc))


async def start(fn: Any, body: Any, pipeliner: HeldPipeliner, deadline_ms: int = 0) -> asyncio.Future[Reply]:
    streams = Streams(
        pipeliner=pipeliner,  # type: ignore[arg-type]
        threads=HandlerThreads(1),
        replica_id="r#1",
        deployment="s",
        figures=None,
        user_error=user_error,
    )
    request = Request("req-1", "replies", deadline_ms, b"null", stream=True)
    scope = RequestScope(request.request_id, deadline_ms)
    return streams.start(request, Handler(fn, is_async=True, is_stream=True), body, CONFIG, scope)


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


async def test_a_chunk_reply_redis_refused_is_sent_again_with_the_same_seq() -> None:
    pipeliner = HeldPipeliner()
    outcome = await start(lambda _body: two(), None, pipeliner)
    await turns()
    assert pipeliner.chunks() == [(0, 1)]  # the first chunk goes at once, alone
    pipeliner.sent[0][1].set_exception(RedisConnectionError("Redis is away"))
    await wait_for_async(lambda: len(pipeliner.sent) == 2, 5, "the refused reply was never sent again")
    assert pipeliner.chunks() == [(0, 1), (0, 1)]
    assert not outcome.done()
    pipeliner.answer(1)
    await turns()
    assert pipeliner.chunks() == [(0, 1), (0, 1), (1, 1)]  # the next only once the first is in Redis
    pipeliner.answer(2)
    await turns()
    assert outcome.result().status is ReplyStatus.END and outcome.result().seq == 2


async def test_chunks_redis_never_took_end_the_stream_at_its_deadline_counting_only_those_it_took() -> None:
    pipeliner, gate = HeldPipeliner(), asyncio.Event()
    outcome = await start(lambda _body: three_then_gate(gate), None, pipeliner, deadline_ms=now_ms() + 300)
    await turns()
    pipeliner.answer(0)  # chunk 0 is in Redis
    gate.set()
    await turns()
    assert pipeliner.chunks() == [(0, 1), (1, 2)]

    async def refuse_until_given_up() -> bool:
        for _reply, future in pipeliner.sent:
            if not future.done():
                future.set_result([ResponseError("OOM command not allowed when used memory > maxmemory")])
        return outcome.done()

    await wait_for_async(refuse_until_given_up, 5, "the stream never gave up")
    final = outcome.result()
    assert final.status is ReplyStatus.DEADLINE_EXCEEDED and final.seq == 1
