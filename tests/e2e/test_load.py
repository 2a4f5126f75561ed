"""Backpressure, deadlines and batching through a real `streamserve up` (its own farm: tests/e2e/load.yaml)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from streamserve import Client
from streamserve.control.status import StatusReader
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from tests.harness.farm import Farm, running_farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
KEYS = Keys()  # the farm runs with the default key prefix
BURST = 1000
CONCURRENCY = 250  # requests in flight at once: well above what `bounded` can hold, so its queue fills
CLIENTS = 10  # httpx clients sharing the burst (one client's pool gets slow with hundreds of connections)
MAX_QUEUED = 100
HELD = 4  # max_ongoing_requests x num_replicas of `bounded`: entries read but not yet acknowledged


@pytest.fixture(scope="module")
def load_farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm(HERE / "load.yaml", tmp_path_factory.mktemp("load")) as farm:
        yield farm


def http_client(farm: Farm, limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    """Straight to the farm on 127.0.0.1 (no proxy from the environment)."""
    return httpx.AsyncClient(
        base_url=farm.base_url, timeout=60, trust_env=False, limits=limits or httpx.Limits(max_connections=100)
    )


async def burst(farm: Farm) -> tuple[list[httpx.Response], list[tuple[int, int]]]:
    """POST BURST requests, CONCURRENCY at a time; meanwhile sample (queued, stream length) as `status` reads them."""
    per_client = CONCURRENCY // CLIENTS
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    gate = asyncio.Semaphore(CONCURRENCY)
    samples: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def post(http: httpx.AsyncClient, i: int) -> httpx.Response:
        async with gate:
            return await http.post("/bounded", json={"i": i})

    async def post_all() -> list[httpx.Response]:
        async with contextlib.AsyncExitStack() as stack:
            https = [await stack.enter_async_context(http_client(farm, limits=limits)) for _ in range(CLIENTS)]
            answers = await asyncio.gather(*(post(https[i % CLIENTS], i) for i in range(BURST)), return_exceptions=True)
        failed = [(i, repr(a), repr(a.__cause__)) for i, a in enumerate(answers) if isinstance(a, BaseException)]
        assert not failed, f"{len(failed)} requests got no answer, e.g. {failed[:3]}:\n{farm.log()[-3000:]!r}"
        return [a for a in answers if isinstance(a, httpx.Response)]

    async def sample(r: aioredis.Redis) -> None:
        status = StatusReader(r, KEYS)
        while not done.is_set():
            bounded = next(s for s in await status.status() if s.name == "bounded")
            samples.append((bounded.queued, bounded.queued + bounded.in_flight))
            await asyncio.sleep(0.05)

    r = aioredis.Redis.from_url(farm.effective_redis_url)
    try:
        sampler = asyncio.create_task(sample(r))
        responses = await post_all()
        done.set()
        await sampler
    finally:
        await r.aclose()
    return responses, samples


def test_a_burst_past_max_queued_requests_is_answered_200_or_503_and_the_queue_stays_bounded(load_farm: Farm) -> None:
    responses, samples = asyncio.run(burst(load_farm))
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200, 503}, f"unexpected statuses {sorted(set(statuses))}"
    for i, resp in enumerate(responses):
        if resp.status_code == 200:
            assert resp.json() == {"i": i}
        else:
            assert int(resp.headers["retry-after"]) >= 1
            assert resp.json()["error"] == "OverloadedError"
            assert "max_queued_requests" in resp.json()["message"]
    # What `status` calls queued never passes the bound; the stream holds at most that plus what replicas hold.
    assert samples and any(queued > 0 for queued, _length in samples)
    assert max(queued for queued, _length in samples) <= MAX_QUEUED
    assert max(length for _queued, length in samples) <= MAX_QUEUED + HELD
    # Acknowledged entries are deleted: once the burst is served, the stream is empty.
    r = redis.Redis.from_url(load_farm.effective_redis_url)
    try:
        stream = KEYS.requests("bounded")
        wait_for(lambda: r.xlen(stream) == 0, 20, "request stream did not drain to 0")
        assert r.xpending(stream, CONSUMER_GROUP)["pending"] == 0
    finally:
        r.close()
    print(f"burst of {BURST}: {statuses.count(200)} x 200, {statuses.count(503)} x 503")


def test_a_request_whose_deadline_passes_in_the_queue_is_504_and_never_runs(load_farm: Farm, tmp_path: Path) -> None:
    gate = tmp_path / "open"  # the ledger's one slot is held by "blocker" until this file exists
    r = redis.Redis.from_url(load_farm.effective_redis_url)
    try:
        with ThreadPoolExecutor(1) as pool:
            blocker = pool.submit(load_farm.post, "/ledger", {"id": "blocker", "wait_for": str(gate)})
            stream = KEYS.requests("ledger")
            wait_for(lambda: r.xpending(stream, CONSUMER_GROUP)["pending"] == 1, 20, "blocker not running")
            late = load_farm.post("/ledger", {"id": "late"}, headers={"X-Request-Timeout": "0.5"})
            assert late.status_code == 504
            assert late.json()["error"] == "RequestTimeoutError"
            gate.touch()
            assert blocker.result(timeout=30).json() == "blocker"
    finally:
        r.close()
    with Client(load_farm.effective_redis_url) as client:
        # One slot, first in first out: by the time `seen` runs, "late" has been taken off the queue, unrun.
        assert client.call("ledger", None, method="seen", timeout=10) == ["blocker"]


def test_the_batched_example_answers_every_caller_with_its_own_item(load_farm: Farm) -> None:
    async def calls() -> list[httpx.Response]:
        async with http_client(load_farm) as http:
            return list(await asyncio.gather(*(http.post("/batched", json={"x": i}) for i in range(40))))

    responses = asyncio.run(calls())
    assert [r.status_code for r in responses] == [200] * 40
    assert [r.json()["y"] for r in responses] == [2.0 * i for i in range(40)]
    sizes = [r.json()["batch_size"] for r in responses]
    assert all(1 <= size <= 16 for size in sizes)
    # Each batch of N answered N of these callers, each reporting N; and 40 callers at once did share a batch.
    assert all(count % size == 0 for size, count in Counter(sizes).items()), sorted(sizes)
    assert max(sizes) > 1, "40 concurrent callers never shared a batch"
    print(f"batch sizes seen: {sorted(sizes)}")
