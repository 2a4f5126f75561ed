"""A replica's Finisher when a Redis Cluster refuses some commands of its round trip (CLUSTERDOWN while a master
without replicas is down): those did not run, and must go again, not be taken as done."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ClusterDownError

from streamserve.transport.pipelining import Command
from streamserve.wire.messages import Reply, ReplyStatus
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


async def test_an_acknowledgement_a_cluster_refused_goes_again_and_only_then_is_the_entry_finished() -> None:
    down = ClusterDownError("The cluster is down")
    pipeliner = ScriptedPipeliner([b"1-0", down, down], [b"2-0", 1, 1])
    finished: list[list[bytes]] = []
    finisher = Finisher(pipeliner, lambda lane: "requests", finished.append, "echo#1")  # type: ignore[arg-type]
    finisher.finish(b"5-0", Reply("r1", ReplyStatus.OK, "echo#1", body=b"1"), "replies:c1")

    async def sent_twice() -> bool:
        return len(pipeliner.sent) == 2

    await wait_for_async(sent_twice, 5, "the refused acknowledgement was not sent again")
    await wait_for_async(lambda: _true(finished == [[b"5-0"]]), 5, "the entry was not finished once it went through")
    first, again = pipeliner.sent
    assert [command[0] for command in first] == [command[0] for command in again] == ["XADD", "XACK", "XDEL"]
    assert finished == [[b"5-0"]]  # not before: counted finished, it was left pending in the group for good


async def _true(value: bool) -> bool:
    return value
