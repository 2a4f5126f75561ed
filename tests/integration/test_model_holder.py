"""A replica's ModelHolder on a real redis-server: which of its models another live replica holds too (what its caches
unload first, streamserve.multiplexing), as of its last renewal."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.transport.model_streams import ModelStreams
from streamserve.transport.streams import ensure_groups
from streamserve.workers.model_holder import ModelHolder
from tests.harness.waiting import wait_for_async


async def test_a_replica_knows_which_of_its_models_another_live_replica_holds_too(
    aredis: aioredis.Redis, settings: Settings
) -> None:
    name = f"mux-{uuid.uuid4().hex[:8]}"
    await ensure_groups(aredis, settings.keys, name)
    streams = ModelStreams(aredis, settings.keys)
    one = ModelHolder(settings, streams, name, "r1", None, 2)
    two = ModelHolder(settings, streams, name, "r2", None, 2)
    await one.start()
    await two.start()
    for model_id in ("a", "b"):
        one.loaded(model_id, 0.1)
    two.loaded("b", 0.1)
    await wait_for_async(lambda: _shared_is(two, {"b"}), 5, lambda: f"r2 says {two.shared()}")
    await one.renew()
    assert one.shared() == {"b"}
    two.unloaded("b")
    await wait_for_async(lambda: _renewed_to(one, set()), 5, lambda: f"r1 says {one.shared()}")
    one.loaded("c", 0.1)  # r1 holds a and c (its cache unloaded b to load it) now
    one.unloaded("b")
    two.loaded("c", 0.1)
    await wait_for_async(lambda: _shared_is(two, {"c"}), 5, lambda: f"r2 says {two.shared()}")
    await one.renew()
    assert one.shared() == {"c"}
    await two.leave()
    await one.renew()
    assert one.shared() == set()


async def _shared_is(holder: ModelHolder, models: set[str]) -> bool:
    return holder.shared() == models


async def _renewed_to(holder: ModelHolder, models: set[str]) -> bool:
    await holder.renew()
    return holder.shared() == models
