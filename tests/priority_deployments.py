"""Deployments for the priority tests (tests/e2e/test_priorities.py), which run in replica processes.

``ordered`` records each run on a Redis list of the farm's Redis named by the ``tag`` in its body (``order_key``):
the body's ``label``, then (on a list of its own, ``pids_key``) the replica's pid. It waits while the body's
``hold`` key exists (a test deletes it to let the run end), then ``work_s`` seconds more. A run that finds more runs
of its process going on than the body's ``limit`` says so on another list (``overlaps_key``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from tests.farm_redis import farm_redis

# How often a held run looks at its hold key again.
POLL_S = 0.02
# The longest a run is held.
HOLD_MAX_S = 60.0

_running = 0


def order_key(tag: str) -> str:
    """The list the runs of requests tagged ``tag`` record their labels on, in the order they started."""
    return f"priority-test:order:{tag}"


def pids_key(tag: str) -> str:
    """The list the runs of requests tagged ``tag`` record their replica's pid on."""
    return f"priority-test:pids:{tag}"


def overlaps_key(tag: str) -> str:
    """The list a run of a request tagged ``tag`` records on how many ran at once, when that was above its limit."""
    return f"priority-test:overlaps:{tag}"


async def ordered(body: dict[str, Any]) -> dict[str, Any]:
    global _running
    _running += 1
    try:
        redis = farm_redis()
        async with redis.pipeline(transaction=True) as pipe:
            pipe.rpush(order_key(body["tag"]), body["label"])
            pipe.rpush(pids_key(body["tag"]), os.getpid())
            if _running > body.get("limit", _running):
                pipe.rpush(overlaps_key(body["tag"]), _running)
            await pipe.execute()
        hold = body.get("hold")
        until = time.monotonic() + HOLD_MAX_S
        while hold and await redis.exists(hold) and time.monotonic() < until:
            await asyncio.sleep(POLL_S)
        await asyncio.sleep(float(body.get("work_s", 0)))
        return {"label": body["label"]}
    finally:
        _running -= 1
