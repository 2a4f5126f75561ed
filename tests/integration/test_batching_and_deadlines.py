"""Dynamic batching and deadlines in a real replica, over a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import RemoteError, RequestTimeoutError
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Request, now_ms
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy


@pytest.fixture(autouse=True)
def _fresh_records() -> None:
    deployments.BATCH_SIZES.clear()
    deployments.BATCH_BODIES.clear()
    deployments.BATCH_MODELS.clear()
    deployments.CALLS.clear()


async def queue_up(
    client: AsyncClient, aredis: aioredis.Redis, settings: Settings, bodies: list[Any], method: str = ""
) -> list[asyncio.Task[Any]]:
    """Start one call per body while no replica runs, and return once all of them wait in the stream."""
    calls = [client.submit("rec", body, method=method, timeout=20) for body in bodies]

    async def all_queued() -> bool:
        return bool(await aredis.xlen(settings.keys.requests("rec")) == len(bodies))

    await wait_for_async(all_queued, 10)
    return calls


@pytest.mark.parametrize(
    ("import_path", "method"),
    [
        ("tests.deployments:BatchedModel", ""),  # sync __call__ of a class
        ("tests.deployments:BatchedModel", "predict"),  # async method
        ("tests.deployments:batched_fn", ""),  # async function
    ],
)
async def test_concurrent_callers_each_get_their_own_item_from_shared_batches(
    start_replica: StartReplica,
    client: AsyncClient,
    aredis: aioredis.Redis,
    settings: Settings,
    import_path: str,
    method: str,
) -> None:
    fields = {"import_path": import_path, "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    bodies = [{"n": i} for i in range(20)]
    calls = await queue_up(client, aredis, settings, bodies, method)
    await start_replica(**fields)  # its first read takes 8 queued requests at once: one full batch
    results = await asyncio.gather(*calls)
    assert [r["in"] for r in results] == bodies
    assert sum(deployments.BATCH_SIZES) == 20
    assert max(deployments.BATCH_SIZES) == 8 and all(1 <= size <= 8 for size in deployments.BATCH_SIZES)
    assert {r["size"] for r in results} <= set(deployments.BATCH_SIZES)


async def test_a_batch_is_of_one_models_requests_and_model_id_names_it(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    fields = {"import_path": "tests.deployments:BatchedModels", "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    models = ["a", "b"] * 6
    calls = [client.submit("rec", n, model_id=model, timeout=20) for n, model in enumerate(models)]

    async def all_queued() -> bool:
        return bool(await aredis.xlen(settings.keys.requests("rec")) == len(models))

    await wait_for_async(all_queued, 10)
    await start_replica(**fields)  # its first read takes 8 queued requests at once: 4 of each model
    results = await asyncio.gather(*calls)
    assert [(r["in"], r["model"]) for r in results] == list(enumerate(models))
    assert sum(size for _model, size in deployments.BATCH_MODELS) == len(models)
    assert max(size for _model, size in deployments.BATCH_MODELS) > 1  # batched, one model at a time


async def test_a_deployment_without_models_batches_requests_whatever_model_they_name(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    fields = {"import_path": "tests.deployments:BatchedModel", "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    calls = [client.submit("rec", n, model_id=f"m{n}", timeout=20) for n in range(8)]

    async def all_queued() -> bool:
        return bool(await aredis.xlen(settings.keys.requests("rec")) == 8)

    await wait_for_async(all_queued, 10)
    await start_replica(**fields)
    assert [r["in"] for r in await asyncio.gather(*calls)] == list(range(8))
    assert deployments.BATCH_SIZES == [8]


async def test_a_partial_batch_runs_when_the_wait_passes(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    fields = {"import_path": "tests.deployments:batched_fn", "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    calls = await queue_up(client, aredis, settings, ["a", "b", "c"])
    await start_replica(**fields)
    assert [r["in"] for r in await asyncio.gather(*calls)] == ["a", "b", "c"]
    assert deployments.BATCH_SIZES == [3]  # max_batch_size is 8: the 50 ms wait let the 3 go


async def test_a_length_mismatch_fails_the_whole_batch_with_a_clear_error(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    fields = {"import_path": "tests.deployments:batched_short", "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    calls = await queue_up(client, aredis, settings, [1, 2, 3, 4])
    await start_replica(**fields)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert deployments.BATCH_SIZES == [4]
    for result in results:
        assert isinstance(result, RemoteError)
        assert result.error_type == "BatchOutputError"
        assert result.message.startswith("batched_short returned 3 outputs for 4 inputs")


async def test_an_exception_fails_the_whole_batch_and_the_next_batch_is_served(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    fields = {"import_path": "tests.deployments:batched_boom", "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    calls = await queue_up(client, aredis, settings, ["a", "bad", "c"])
    await start_replica(**fields)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert deployments.BATCH_SIZES == [3]
    assert [(r.error_type, r.message) for r in results if isinstance(r, RemoteError)] == [
        ("ValueError", "one bad input in the batch")
    ] * 3
    assert await client.call("rec", "fine") == "fine"


async def test_expired_requests_are_answered_without_joining_a_batch(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    fields = {"import_path": "tests.deployments:batched_fn", "max_ongoing_requests": 8}
    await deploy(settings, **fields)
    await client.start()
    reply_stream = settings.keys.reply_stream(client.caller_id)
    stale = Request("stale-1", reply_to=reply_stream, deadline_ms=now_ms() - 1000, body=b'"late"')
    await aredis.xadd(settings.keys.requests("rec"), stale.encode())
    calls = [client.submit("rec", body, timeout=20) for body in ("x", "y")]

    async def three_queued() -> bool:
        return bool(await aredis.xlen(settings.keys.requests("rec")) == 3)

    await wait_for_async(three_queued, 10)
    await start_replica(**fields)
    assert [r["in"] for r in await asyncio.gather(*calls)] == ["x", "y"]

    async def stale_answered() -> bool:
        return any(entry.get(b"id") == b"stale-1" for _id, entry in await aredis.xrange(reply_stream))

    await wait_for_async(stale_answered, 10)
    replies = {entry.get(b"id"): entry.get(b"status") for _id, entry in await aredis.xrange(reply_stream)}
    assert replies[b"stale-1"] == b"deadline_exceeded"
    assert deployments.BATCH_SIZES == [2]
    assert "late" not in deployments.BATCH_BODIES


async def test_drain_runs_a_partial_batch_at_once(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    # batched_patient waits a minute for a full batch; a replica told to stop must not.
    replica = await start_replica(import_path="tests.deployments:batched_patient", max_ongoing_requests=8)
    calls = [client.submit("rec", body, timeout=20) for body in ("p", "q")]

    async def both_held() -> bool:
        return bool((await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP))["pending"] == 2)

    await wait_for_async(both_held, 10)
    replica.request_stop()
    assert await asyncio.gather(*calls) == ["p", "q"]
    assert deployments.BATCH_SIZES == [2]


async def test_a_request_that_expires_while_queued_times_out_and_never_runs(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    deployments.GATE = asyncio.Event()
    await start_replica(import_path="tests.deployments:gated_recorder", max_ongoing_requests=1)
    first = client.submit("rec", "first")

    async def first_running() -> bool:
        return deployments.CALLS == ["first"]

    await wait_for_async(first_running, 10)
    with pytest.raises(RequestTimeoutError):
        await client.call("rec", "late", timeout=0.3)  # queued behind "first" until its deadline passed
    deployments.GATE.set()
    assert await first == "first"
    assert await client.call("rec", "after") == "after"  # FIFO: "late" has been taken off the queue by now
    assert deployments.CALLS == ["first", "after"]
    assert await aredis.xlen(settings.keys.requests("rec")) == 0
