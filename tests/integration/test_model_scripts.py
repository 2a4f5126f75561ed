"""The scripts of model multiplexing on a real redis-server (wire/models.py): the enqueue's route to the least busy
live holder of a request's model while it has room, holds that lapse, a gone replica's routed queue given back, and
dead replicas' routed entries re-queued on the deployment's stream."""

from __future__ import annotations

import uuid
from typing import cast

import pytest
import redis.asyncio as aioredis

from streamserve.client.cancels import Canceller
from streamserve.runtime.settings import Settings
from streamserve.scheduler.reclaim import Reclaimer
from streamserve.transport.model_streams import ModelStreams
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import Requeuer, ensure_groups
from streamserve.wire import scripts
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import Request, now_ms
from streamserve.wire.models import route_spec, routed_lane
from tests.harness.waiting import wait_for_async

MODEL = "org/lora:v2"
HOLD_MS = 60_000


@pytest.fixture
def name() -> str:
    return f"mux-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def models(aredis: aioredis.Redis, settings: Settings, name: str) -> ModelStreams:
    await ensure_groups(aredis, settings.keys, name)
    return ModelStreams(aredis, settings.keys)


def request(label: str) -> Request:
    return Request(label, "", now_ms() + 60_000, b"1", model=MODEL)


def route(keys: Keys, name: str, max_ongoing: int, model: str = MODEL) -> str:
    return route_spec(model, max_ongoing, HOLD_MS, keys.models_prefix(name))


def route_keys(keys: Keys, name: str, model: str = MODEL) -> list[str]:
    return [keys.model_holders(name, model), keys.routed_replicas(name), keys.model_room(name)]


async def enqueue(
    redis: aioredis.Redis, keys: Keys, name: str, label: str, max_ongoing: int = 1, model: str = MODEL
) -> str:
    """What Calls._add sends for a request naming ``model`` (to a deployment with ``max_ongoing``
    max_ongoing_requests: a holder is saturated at twice that): its entry id, or a routed stream's ref."""
    fields = [part for item in request(label).encode().items() for part in item]
    sent = [keys.requests(name), *route_keys(keys, name, model)]
    args = [100, CONSUMER_GROUP, "", route(keys, name, max_ongoing, model), *fields]
    found = await redis.eval(scripts.ENQUEUE, len(sent), *sent, *args)  # type: ignore[misc]
    return cast(bytes, found).decode()


async def labels(redis: aioredis.Redis, stream: str) -> list[str]:
    return [fields[b"id"].decode() for _id, fields in await redis.xrange(stream)]


async def test_a_request_goes_to_the_least_busy_live_holder_of_its_model_while_it_has_room(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    general, r1, r2 = keys.requests(name), keys.routed_requests(name, "r1"), keys.routed_requests(name, "r2")
    assert "/" not in await enqueue(aredis, keys, name, "before")  # no replica is live: the deployment's stream
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    assert (await enqueue(aredis, keys, name, "r1-a")).startswith("to:r1/")
    await enqueue(aredis, keys, name, "r1-b")
    await enqueue(aredis, keys, name, "overflow")  # r1 has 2 entries (2 x max_ongoing_requests 1): saturated
    await models.hold(name, "r2", [MODEL], HOLD_MS, 2)
    assert (await enqueue(aredis, keys, name, "r2-a")).startswith("to:r2/")  # the holder with fewer
    await models.unhold(name, "r2", MODEL)
    await enqueue(aredis, keys, name, "after")  # r1 saturated, r2 holds it no more: no new holder while one is
    assert await labels(aredis, r1) == ["r1-a", "r1-b"]
    assert await labels(aredis, r2) == ["r2-a"]
    assert await labels(aredis, general) == ["before", "overflow", "after"]


async def test_a_model_nobody_holds_is_given_to_the_replica_with_the_most_room_else_one_holding_a_shared_model(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    await models.hold(name, "r1", ["a"], HOLD_MS, 2)  # room for one more
    await models.hold(name, "r2", [], HOLD_MS, 2)  # room for two
    assert (await enqueue(aredis, keys, name, "b-1", max_ongoing=4, model="b")).startswith("to:r2/")
    # r2 was given b: b's next request follows, though both now have room for one.
    assert (await enqueue(aredis, keys, name, "b-2", max_ongoing=4, model="b")).startswith("to:r2/")
    assert await aredis.zrange(keys.model_holders(name, "b"), 0, -1) == [b"r2"]
    assert (await enqueue(aredis, keys, name, "c-1", max_ongoing=4, model="c")).startswith("to:r1/")  # fewer entries
    assert (await enqueue(aredis, keys, name, "d-1", max_ongoing=4, model="d")).startswith("to:r2/")
    # No room anywhere, and every model held by one replica alone: the deployment's stream, where any replica takes
    # it (and unloads its least recently used model, which only it knows).
    assert "/" not in await enqueue(aredis, keys, name, "e-1", max_ongoing=4, model="e")
    # r3 is idle, but each of its models is held by it alone; r1 and r2 both hold a (either unloads it first, and a
    # stays held): the less busy of them (r1: 1 entry, r2: 3) is given the next model nobody holds.
    await models.hold(name, "r3", ["x", "y"], HOLD_MS, 2)
    await models.hold(name, "r2", ["b", "d", "a"], HOLD_MS, 2)
    assert (await enqueue(aredis, keys, name, "f-1", max_ongoing=4, model="f")).startswith("to:r1/")
    # Both saturated (2 entries at max_ongoing_requests 1), r3 full: the deployment's stream.
    assert "/" not in await enqueue(aredis, keys, name, "g-1", max_ongoing=1, model="g")


async def test_a_hold_lapses_unless_renewed(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    await models.hold(name, "r1", [MODEL], 300, 2)
    await models.hold(name, "r2", [MODEL], HOLD_MS, 2)
    for _ in range(10):  # r2 is busier: r1 gets the requests while its hold lasts
        await aredis.xadd(keys.routed_requests(name, "r2"), {"busy": "1"})
    assert (await enqueue(aredis, keys, name, "to-r1", max_ongoing=100)).startswith("to:r1/")
    until = await aredis.zscore(keys.model_holders(name, MODEL), "r1")
    assert until is not None

    async def passed() -> bool:  # by Redis's clock, which the holds go by
        seconds, micros = await aredis.time()
        return seconds * 1000 + micros // 1000 > until

    await wait_for_async(passed, 5, "r1's hold never passed")
    # r1 has fewer entries, but its hold has lapsed.
    assert (await enqueue(aredis, keys, name, "probe", max_ongoing=100)).startswith("to:r2/")
    assert await aredis.zscore(keys.model_holders(name, MODEL), "r1") is None


async def test_a_hold_says_which_models_another_live_replica_holds_too(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    assert await models.hold(name, "r1", ["a", "b"], HOLD_MS, 2) == set()
    assert await models.hold(name, "r2", ["b", "c"], 300, 2) == {"b"}
    assert await models.hold(name, "r1", ["a", "b"], HOLD_MS, 2) == {"b"}
    until = await aredis.zscore(settings.keys.model_holders(name, "b"), "r2")
    assert until is not None

    async def passed() -> bool:
        seconds, micros = await aredis.time()
        return seconds * 1000 + micros // 1000 > until

    await wait_for_async(passed, 5, "r2's hold never passed")
    assert await models.hold(name, "r1", ["a", "b"], HOLD_MS, 2) == set()  # r2's hold lapsed: it is not live


async def test_the_enqueue_sent_again_finds_a_routed_entry(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    ref = await enqueue(aredis, keys, name, "once")
    fields = [part for item in request("once").encode().items() for part in item]
    sent = [keys.requests(name), *route_keys(keys, name)]
    args = [100, CONSUMER_GROUP, "once", "", route(keys, name, 1), *fields]
    found = await aredis.eval(scripts.ENQUEUE_AGAIN, len(sent), *sent, *args)  # type: ignore[misc]
    assert cast(bytes, found).decode() == ref
    assert await aredis.xlen(keys.routed_requests(name, "r1")) == 1


async def test_a_leaving_replica_gives_its_queue_back_keeps_what_runs_and_is_routed_nothing_more(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    stream = keys.routed_requests(name, "r1")
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    for label in ("running", "queued-1", "queued-2"):
        await enqueue(aredis, keys, name, label, max_ongoing=10)
    await aredis.xreadgroup(CONSUMER_GROUP, "r1", {stream: ">"}, count=1)
    left = await models.leave(name, "r1", [MODEL])
    assert (left.given_back, left.length, left.pending) == (2, 1, 1)
    assert await labels(aredis, keys.requests(name)) == ["queued-1", "queued-2"]
    assert await labels(aredis, stream) == ["running"]
    assert "/" not in await enqueue(aredis, keys, name, "next", max_ongoing=10)
    # Once what ran is acknowledged and deleted, the next sweep deletes the stream.
    [[_, [(entry_id, _fields)]]] = await aredis.xreadgroup(CONSUMER_GROUP, "r1", {stream: "0"})
    await aredis.xack(stream, CONSUMER_GROUP, entry_id)
    await aredis.xdel(stream, entry_id)
    assert (await models.sweep(name)).length == 0
    assert not await aredis.exists(stream, keys.routed_replicas(name))


async def test_the_sweep_gives_back_a_lapsed_replicas_queue_and_keeps_kedas_count(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    await models.hold(name, "dead", [MODEL], 400, 2)
    await enqueue(aredis, keys, name, "stranded", max_ongoing=5)
    await enqueue(aredis, keys, name, "stranded-2", max_ongoing=5)
    swept = await models.sweep(name)
    assert (swept.length, swept.given_back) == (2, 0)  # still live
    assert await aredis.xlen(keys.model_backlog(name)) == 2

    async def given_back() -> bool:
        return (await models.sweep(name)).given_back == 2

    await wait_for_async(given_back, 5, "the lapsed replica's queue was not given back")
    assert await labels(aredis, keys.requests(name)) == ["stranded", "stranded-2"]
    assert await aredis.xlen(keys.model_backlog(name)) == 0
    assert (await models.figures(name)).length == 0


async def test_a_request_is_never_routed_to_a_holder_whose_queue_was_given_back(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    """A holder listed past its replica's own time (it was given the model just before it died) gets nothing: its
    stream, given back and deleted, would be made anew without a group, and the request wait there for good."""
    keys = settings.keys
    await models.hold(name, "dead", [], 300, 2)
    seconds, micros = await aredis.time()
    await aredis.zadd(keys.model_holders(name, MODEL), {"dead": seconds * 1000 + micros // 1000 + 60_000})
    until = await aredis.zscore(keys.routed_replicas(name), "dead")
    assert until is not None

    async def lapsed() -> bool:
        seconds, micros = await aredis.time()
        return seconds * 1000 + micros // 1000 > until

    await wait_for_async(lapsed, 5, "the replica's own time never passed")
    # Lapsed, its stream not yet given back by a sweep: not a holder any more.
    assert not (await enqueue(aredis, keys, name, "lapsed")).startswith("to:dead/")

    async def given_back() -> bool:
        await models.sweep(name)
        return not await aredis.exists(keys.routed_requests(name, "dead"))

    await wait_for_async(given_back, 5, "the dead replica's stream was not given back")
    assert not (await enqueue(aredis, keys, name, "after")).startswith("to:dead/")
    assert not await aredis.exists(keys.routed_requests(name, "dead"))
    assert await labels(aredis, keys.requests(name)) == ["lapsed", "after"]
    # A live holder whose stream is gone all the same (deleted by hand): the request goes to the deployment's stream.
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    await aredis.delete(keys.routed_requests(name, "r1"))
    assert not (await enqueue(aredis, keys, name, "unmade")).startswith("to:")
    assert not await aredis.exists(keys.routed_requests(name, "r1"))
    assert await labels(aredis, keys.requests(name)) == ["lapsed", "after", "unmade"]


async def test_a_dead_replicas_routed_entries_go_to_the_deployments_stream_and_handed_back_ones_stay(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    stream = keys.routed_requests(name, "r1")
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    for label in ("handed-back", "held"):
        await enqueue(aredis, keys, name, label)
    [[_, read]] = await aredis.xreadgroup(CONSUMER_GROUP, "r1", {stream: ">"})
    lane = routed_lane("r1")
    await Requeuer(aredis, keys).requeue(name, [read[0][0]], charge=False, max_delivery_attempts=3, lane=lane)
    assert await labels(aredis, stream) == ["held", "handed-back"]  # the replica is alive: its own queue
    cfg = DeploymentConfig(name=name, import_path="x:y")
    result = await Reclaimer(aredis, keys).reclaim(cfg, live=set())  # r1 is dead
    assert result.requeued == 1
    [(_id, fields)] = await aredis.xrange(keys.requests(name))
    assert (fields[b"id"], fields[b"attempts"], fields[b"model"]) == (b"held", b"1", MODEL.encode())


async def test_a_queued_routed_request_is_cancelled_by_its_ref(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    keys = settings.keys
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    ref = await enqueue(aredis, keys, name, "unwanted")
    canceller = Canceller(aredis, Pipeliner(aredis), keys)
    assert await canceller.cancel(name, ref, "unwanted", request("unwanted")) == "queued"
    assert await aredis.xlen(keys.routed_requests(name, "r1")) == 0


async def test_the_sweep_tells_the_last_entry_read_from_the_routed_streams(
    aredis: aioredis.Redis, settings: Settings, name: str, models: ModelStreams
) -> None:
    """For autoscaling: a routed request that was read and acknowledged between two sweeps is in no length, but the
    last-delivered id it left moves (scheduler/autoscaler.py's Load); status' figures do not look."""
    keys = settings.keys
    await models.hold(name, "r1", [MODEL], HOLD_MS, 2)
    assert (await models.sweep(name)).last_read == (0, 0)
    stream = keys.routed_requests(name, "r1")
    for label in ("one", "two"):
        assert "/" in await enqueue(aredis, keys, name, label, max_ongoing=10)
        [[_, [(entry_id, _fields)]]] = await aredis.xreadgroup(CONSUMER_GROUP, "r1", {stream: ">"}, count=1)
        await aredis.xack(stream, CONSUMER_GROUP, entry_id)
        await aredis.xdel(stream, entry_id)
        ms, seq = entry_id.decode().split("-")
        swept = await models.sweep(name)
        assert (swept.length, swept.last_read) == (0, (int(ms), int(seq)))
    assert (await models.figures(name)).last_read == (0, 0)
