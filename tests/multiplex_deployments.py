"""Deployments for the multiplexing tests (tests/e2e/test_multiplexing.py), which run in replica processes.

Each load of a model is recorded on a Redis list of the farm's Redis (``loads_key(model_id)``: the pid of the replica
that loaded it), each model closed on another (``closed_key(pid)``: its model ids, in the order closed), so that the
tests see what replicas did. Model ids starting ``flaky`` fail their first load on each replica.
"""

from __future__ import annotations

import asyncio
import os
import time
from functools import cache
from typing import Any

import redis

import streamserve
from tests.farm_redis import farm_redis

LOAD_S = 0.2


def loads_key(model_id: str) -> str:
    """The list each load of ``model_id`` records its replica's pid on."""
    return f"mux-test:loads:{model_id}"


def closed_key(pid: int) -> str:
    """The list replica ``pid`` records the models it closed on, in order."""
    return f"mux-test:closed:{pid}"


@cache
def _sync_redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"])


class Model:
    """A loaded 'model': what it was loaded as, by which process."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.pid = os.getpid()

    async def aclose(self) -> None:
        await farm_redis().rpush(closed_key(self.pid), self.model_id)


class SyncModel(Model):
    def close(self) -> None:  # type: ignore[override]
        _sync_redis().rpush(closed_key(self.pid), self.model_id)


class Adapters:
    """An async loader, two models at most. Body: ``{"sleep": s}`` holds the request that long after the load."""

    def __init__(self) -> None:
        self.loads = 0
        self._failed: set[str] = set()

    @streamserve.multiplexed(max_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        self.loads += 1
        await farm_redis().rpush(loads_key(model_id), os.getpid())
        await asyncio.sleep(LOAD_S)
        if model_id.startswith("flaky") and model_id not in self._failed:
            self._failed.add(model_id)
            raise RuntimeError(f"cannot load {model_id} (first attempt)")
        return Model(model_id)

    async def __call__(self, body: Any) -> dict[str, Any]:
        model = await self.get_model(streamserve.model_id())
        if isinstance(body, dict) and body.get("sleep"):
            await asyncio.sleep(float(body["sleep"]))
        return {"model": model.model_id, "pid": model.pid, "loads": self.loads}

    async def tokens(self, body: Any) -> Any:
        """Streams its model's id, a character a chunk."""
        model = await self.get_model(streamserve.model_id())
        for char in model.model_id:
            yield char


class SyncAdapters:
    """A sync loader and a sync handler, two models at most."""

    def __init__(self) -> None:
        self.loads = 0

    @streamserve.multiplexed(max_models_per_replica=2)
    def get_model(self, model_id: str) -> SyncModel:
        self.loads += 1
        _sync_redis().rpush(loads_key(model_id), os.getpid())
        time.sleep(LOAD_S)
        return SyncModel(model_id)

    def __call__(self, body: Any) -> dict[str, Any]:
        model = self.get_model(streamserve.model_id())
        return {"model": model.model_id, "pid": model.pid, "loads": self.loads}


async def through_a_handle(body: dict[str, Any]) -> Any:
    """Calls ``adapters`` with the model its body names, through a handle."""
    return await streamserve.handle("adapters").acall({}, model_id=body["model"])


class ModelEcho:
    """A multiplexing deployment that keeps no record (for a Redis Cluster, whose other slots it cannot write)."""

    def __init__(self) -> None:
        self.loads = 0

    @streamserve.multiplexed(max_models_per_replica=2)
    async def get_model(self, model_id: str) -> str:
        self.loads += 1
        return model_id.upper()

    async def __call__(self, body: Any) -> dict[str, Any]:
        return {"model": await self.get_model(streamserve.model_id()), "loads": self.loads, "body": body}
