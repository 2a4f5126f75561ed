"""Deployments for the cancellation tests (tests/e2e/test_cancellation.py), which run in replica processes.

Each records what happened to it on a Redis list of the farm's Redis (the replica's ``REDIS_URL``), named by the
``tag`` in the request's body (``events_key``): "start" when it begins, then "done" when it ends by itself,
"cancelled" on asyncio.CancelledError, "generator-exit" when a generator is closed, "stopped-early" when a sync
handler saw ``cancelled()``, and "finally" last. A test reads the list to see what a handler went through.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis

from streamserve.runtime.request_scope import cancelled

# How often a waiting handler looks again (at its hold key, at cancelled()).
POLL_S = 0.02
# A generator's pause between chunks.
CHUNK_PAUSE_S = 0.05

_connection: redis.Redis | None = None
_connection_lock = threading.Lock()


def events_key(tag: str) -> str:
    """The list a request tagged ``tag`` records its events on."""
    return f"cancel-test:events:{tag}"


def _redis() -> redis.Redis:
    global _connection
    with _connection_lock:
        if _connection is None:
            _connection = redis.Redis.from_url(os.environ["REDIS_URL"])
        return _connection


def record(body: dict[str, Any], event: str) -> None:
    _redis().rpush(events_key(body["tag"]), event)


def _held(body: dict[str, Any], until: float) -> bool:
    """Whether to keep waiting: before ``until``, and while the body's ``hold`` key (if it names one) exists."""
    if time.monotonic() >= until:
        return False
    hold = body.get("hold")
    return hold is None or bool(_redis().exists(hold))


async def wait_async(body: dict[str, Any]) -> str:
    """Async: wait ``sleep_s`` (default 30), or until the ``hold`` key is deleted if the body names one."""
    record(body, "start")
    until = time.monotonic() + float(body.get("sleep_s", 30))
    try:
        while _held(body, until):
            await asyncio.sleep(POLL_S)
        record(body, "done")
        return "done"
    except asyncio.CancelledError:
        record(body, "cancelled")
        raise
    finally:
        record(body, "finally")


def loop_sync(body: dict[str, Any]) -> str:
    """Sync: loop for ``sleep_s`` (default 30), stopping early once ``cancelled()`` says its work is wanted no more."""
    record(body, "start")
    until = time.monotonic() + float(body.get("sleep_s", 30))
    try:
        while time.monotonic() < until:
            if cancelled():
                record(body, "stopped-early")
                return "stopped early"
            time.sleep(POLL_S)
        record(body, "done")
        return "done"
    finally:
        record(body, "finally")


def ignore_sync(body: dict[str, Any]) -> str:
    """Sync, deaf to cancellation: wait while the ``hold`` key exists (at most ``sleep_s``, default 60)."""
    record(body, "start")
    until = time.monotonic() + float(body.get("sleep_s", 60))
    while _held(body, until):
        time.sleep(POLL_S)
    record(body, "done")
    return "done"


def gen_sync(body: dict[str, Any]) -> Iterator[int]:
    """A sync generator: 0, 1, 2, ... (``n``, default 600), CHUNK_PAUSE_S apart."""
    record(body, "start")
    try:
        for i in range(int(body.get("n", 600))):
            yield i
            time.sleep(CHUNK_PAUSE_S)
        record(body, "done")
    except GeneratorExit:
        record(body, "generator-exit")
        raise
    finally:
        record(body, "finally")


async def gen_async(body: dict[str, Any]) -> AsyncIterator[int]:
    """An async generator: 0, 1, 2, ... (``n``, default 600), ``pause_s`` apart (default CHUNK_PAUSE_S; 0: it
    never awaits)."""
    record(body, "start")
    pause_s = float(body.get("pause_s", CHUNK_PAUSE_S))
    try:
        for i in range(int(body.get("n", 600))):
            yield i
            if pause_s:
                await asyncio.sleep(pause_s)
        record(body, "done")
    except GeneratorExit:
        record(body, "generator-exit")
        raise
    except asyncio.CancelledError:
        record(body, "cancelled")
        raise
    finally:
        record(body, "finally")
