"""Deployments for the shared-run tests (tests/e2e/test_shared_runs.py: idempotency keys, the response cache), which
run in replica processes.

``counted`` records each run on a Redis list of the farm's Redis named by the ``tag`` in its body (``runs_key``),
so that a test sees how often the handler really ran. It waits while the body's ``hold`` key exists (a test deletes
it to let the run end), raises when the body says ``fail``, and returns ``size`` bytes of text when it says so.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import redis

from tests.farm_redis import farm_redis

# How often a held run looks at its hold key again.
POLL_S = 0.02
# The longest a run is held.
HOLD_MAX_S = 60.0


def runs_key(tag: str) -> str:
    """The list a request tagged ``tag`` records its runs on."""
    return f"shared-runs-test:runs:{tag}"


async def counted(body: dict[str, Any]) -> dict[str, Any]:
    runs = await farm_redis().rpush(runs_key(body["tag"]), os.getpid())
    hold = body.get("hold")
    until = time.monotonic() + HOLD_MAX_S
    while hold and await farm_redis().exists(hold) and time.monotonic() < until:
        await asyncio.sleep(POLL_S)
    if body.get("fail"):
        raise ValueError(f"failed on purpose (run {runs})")
    if body.get("size"):
        return {"text": "x" * int(body["size"])}
    return {"tag": body["tag"], "run": runs}


async def counted_stream(body: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
    """``counted`` as a stream: records its run, yields ``n`` chunks (after each, waits while the ``hold`` key
    exists), and raises after ``fail_after`` chunks when the body says so."""
    await farm_redis().rpush(runs_key(body["tag"]), os.getpid())
    hold = body.get("hold")
    until = time.monotonic() + HOLD_MAX_S
    for i in range(int(body.get("n", 3))):
        if i == body.get("fail_after"):
            raise ValueError(f"failed on purpose after {i} chunks")
        yield {"i": i}
        while hold and await farm_redis().exists(hold) and time.monotonic() < until:
            await asyncio.sleep(POLL_S)


class Configured:
    """Answers with the ``v`` of the user_config it was last reconfigured with. A reconfigure whose config names a
    ``hold`` key says it has begun (the key ``<hold>:begun``), then waits while ``hold`` exists: a test holds it to
    send requests while the replica has the new config but its state is still the old one."""

    def __init__(self) -> None:
        self.v: Any = None

    def reconfigure(self, config: dict[str, Any]) -> None:
        _wait_while(config.get("hold"))
        self.v = config["v"]

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        await farm_redis().rpush(runs_key(body["tag"]), os.getpid())
        return {"tag": body["tag"], "v": self.v}


class Versioned(Configured):
    """``Configured`` that also answers with its ``name`` (an init kwarg: a new one is new code). Its constructor
    waits as ``reconfigure`` does while its ``hold`` key exists: a test keeps the old code serving during a rollout."""

    def __init__(self, name: str, hold: str = "") -> None:
        super().__init__()
        self.name = name
        _wait_while(hold)

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**await super().__call__(body), "name": self.name}


def _wait_while(hold: str | None) -> None:
    """Say that the wait has begun (the key ``<hold>:begun``), then wait while ``hold`` exists (no wait without)."""
    if not hold:
        return
    store = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        store.set(f"{hold}:begun", 1, ex=60)
        until = time.monotonic() + HOLD_MAX_S
        while store.exists(hold) and time.monotonic() < until:
            time.sleep(POLL_S)
    finally:
        store.close()
