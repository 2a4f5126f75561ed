"""A replica's Finisher when a Redis Cluster refuses some commands of its round trip (CLUSTERDOWN while a master
without replicas is down): those did not run, and must go again, not be taken as done."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ClusterDownError

from streamserve.transport.pipelining import Command
from streamserve.wire.messages import Reply, ReplyStatus, now_ms
from streamserve.workers.finisher import Finisher
from tests.harness.waiting import wait_for_async


class ScriptedPipeliner:
    """Answers each round trip with the next list of results it was given; keeps what was sent."""

    def __init__(self, *answers: list[Any]) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[Command, ...]] = []

    def execute(self, *commands: Command) -> asyncio.Future[list[Any]]:
        self.sent.append(commands)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        future.set_result(self.answers.pop(0))
        return future


async def test_an_acknowledgement_a_cluster_refused_goes_again_by_itself() -> None:
    """Counted as done, the entry stayed pending in the group for good."""
    down = ClusterDownError("The cluster is down")
    pipeliner = ScriptedPipeliner([b"1-0", down, down], [1, 1])
    finished: list[list[bytes]] = []
    finisher = Finisher(pipeliner, lambda lane: "requests", finished.append, "echo#1")  # type: ignore[arg-type]
    finisher.finish(b"5-0", Reply("r1", ReplyStatus.OK, "echo#1", body=b"1"), "replies:c1")

    async def sent_twice() -> bool:
        return len(pipeliner.sent) == 2

    await wait_for_async(sent_twice, 5, "the refused acknowledgement was not sent again")
    first, again = pipeliner.sent
    assert [command[0] for command in first] == ["XADD", "XACK", "XDEL"]
    assert [command[0] for command in again] == ["XACK", "XDEL"]  # the reply went: it is not sent twice
    assert finished == [[b"5-0"]]


async def test_a_reply_a_cluster_refused_goes_again_and_only_then_is_its_request_finished() -> None:
    """Counted as done, its caller waited out its deadline for a reply that was never sent."""
    pipeliner = ScriptedPipeliner([ClusterDownError("The cluster is down"), 1, 1], [b"2-0"])
    finished: list[list[bytes]] = []
    finisher = Finisher(pipeliner, lambda lane: "requests", finished.append, "echo#1")  # type: ignore[arg-type]
    deadline = now_ms() + 60_000
    finisher.finish(b"5-0", Reply("r1", ReplyStatus.OK, "echo#1", body=b"1"), "replies:c1", deadline)
    await asyncio.sleep(0)  # (its round trip is sent on the next loop turn)
    assert finished == []

    async def sent_again() -> bool:
        return len(pipeliner.sent) == 2 and finished == [[b"5-0"]]

    await wait_for_async(sent_again, 5, "the refused reply was not sent again")
    assert [command[0] for command in pipeliner.sent[1]] == ["XADD"]


async def _true(value: bool) -> bool:
    return value
