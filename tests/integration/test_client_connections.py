"""docs/api.md: "One client opens at most 64 Redis connections for its calls, and at most 4 more for asynchronous jobs;
more concurrent calls than that wait for a free one rather than fail."

A waiting call holds no connection (one reader resolves every reply), and the calls of one event-loop turn
share one round trip, so a slow deployment alone never makes a client want many connections. A slow Redis
does: while Redis holds writes (``CLIENT PAUSE ... WRITE``, as a busy or failing-over server would), each
turn's round trip keeps its connection, and calls started in 120 turns want 120 connections at once. The
client's connections carry a name (``?client_name=`` in its Redis URL), so ``CLIENT LIST`` tells them apart
from the replica's and the test's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

README_CAP = 64
README_JOB_CAP = 4  # "... and at most 4 more for asynchronous jobs"
CALLS = 120
CLIENT_NAME = "capped-client"


async def client_connections(observer: aioredis.Redis) -> int:
    return sum(1 for entry in await observer.client_list() if entry["name"] == CLIENT_NAME)


class Sampler:
    """Counts the client's connections every few milliseconds, remembering the most it ever saw."""

    def __init__(self, observer: aioredis.Redis) -> None:
        self.observer = observer
        self.most = 0
        self.recent: list[int] = []
        self.stopped = False

    async def run(self) -> None:
        while not self.stopped:  # a flag, not only cancel(): redis-py can swallow a cancellation mid-command
            count = await client_connections(self.observer)
            self.most = max(self.most, count)
            self.recent = [*self.recent[-9:], count]
            await asyncio.sleep(0.01)

    def settled(self) -> bool:
        """The same count ten samples in a row: no connection is being opened any more."""
        return len(self.recent) == 10 and len(set(self.recent)) == 1


@pytest.fixture
async def sampler(aredis: aioredis.Redis) -> AsyncIterator[Sampler]:
    sampler = Sampler(aredis)
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        sampler.stopped = True
        await asyncio.wait_for(task, timeout=10)


async def burst_over_a_paused_redis(
    aredis: aioredis.Redis, sampler: Sampler, start: Callable[[int], Coroutine[Any, Any, Any]]
) -> tuple[list[Any], int]:
    """Start ``start(n)`` for n < CALLS, each in an event-loop turn of its own, while Redis holds writes.

    Once the client's connections settle, Redis goes on; returns the results and how many connections were held.
    """
    await aredis.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")  # type: ignore[no-untyped-call]
    try:
        started = []
        for n in range(CALLS):
            started.append(asyncio.ensure_future(start(n)))
            await asyncio.sleep(0)  # the next one starts in a turn of its own: a round trip of its own

        async def saturated() -> bool:
            return sampler.settled() and sampler.recent[-1] > 1

        await wait_for_async(saturated, 10, lambda: f"the client's connections never settled: {sampler.recent}")
        held = sampler.recent[-1]
        assert not any(op.done() for op in started)  # every one is still waiting, none failed
    finally:
        await aredis.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
    return await asyncio.wait_for(asyncio.gather(*started), timeout=30), held


async def test_one_client_opens_at_most_64_connections_and_extra_calls_wait_for_one(
    start_replica: StartReplica, settings: Settings, aredis: aioredis.Redis, sampler: Sampler
) -> None:
    await start_replica(import_path="tests.deployments:slow_echo", max_ongoing_requests=CALLS)
    async with AsyncClient(f"{settings.effective_redis_url}?client_name={CLIENT_NAME}", settings=settings) as client:
        assert await client.call("rec", "warm", timeout=10) == "warm"
        results, held = await burst_over_a_paused_redis(aredis, sampler, lambda n: client.call("rec", n, timeout=30))
    assert results == list(range(CALLS))
    assert sampler.most <= README_CAP, f"the client had {sampler.most} connections open at once"
    assert held == README_CAP, f"{CALLS} calls over a paused Redis held {held} connections, not the cap"


async def test_the_cap_holds_for_a_client_that_also_submits_jobs(
    start_replica: StartReplica, settings: Settings, aredis: aioredis.Redis, sampler: Sampler
) -> None:
    """The documented cap is per client, and submit_job is a client call like the others."""
    await start_replica(import_path="tests.deployments:slow_echo", max_ongoing_requests=CALLS)
    async with AsyncClient(f"{settings.effective_redis_url}?client_name={CLIENT_NAME}", settings=settings) as client:
        assert await client.call("rec", "warm", timeout=10) == "warm"
        await client.submit_job("rec", "warm")

        def call_or_job(n: int) -> Coroutine[Any, Any, Any]:
            return client.submit_job("rec", n) if n % 3 == 0 else client.call("rec", n, timeout=30)

        results, _held = await burst_over_a_paused_redis(aredis, sampler, call_or_job)
    assert [r for n, r in enumerate(results) if n % 3] == [n for n in range(CALLS) if n % 3]
    assert all(isinstance(r, str) for n, r in enumerate(results) if n % 3 == 0)  # job ids
    assert sampler.most <= README_CAP + README_JOB_CAP, f"the client had {sampler.most} connections open at once"
