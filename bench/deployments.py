"""Deployments only the benches use."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import redis

import streamserve
from bench import stream_chunks

# The stream bench's streaming deployment: the generator the bare FastAPI app and Ray Serve iterate too.
chunks = stream_chunks.chunks


async def async_noop(body: Any) -> Any:
    """examples.functions:noop as an async handler: it runs on the replica's event loop, with no hop to a handler
    thread and back (bench/cpu_probe.py --async-handler: what that hop costs a sync noop)."""
    return body


class Reconfigurable:
    """Answers its input; each ``reconfigure`` pushes ``{gen, pid, t}`` to a Redis list the control bench watches.

    ``t`` is this replica's wall clock when reconfigure ran; the bench runs on the same machine, so it
    compares it with its own clock taken just before writing the change.
    """

    def __init__(self, report_url: str, report_key: str) -> None:
        self._redis = redis.Redis.from_url(report_url)
        self._key = report_key
        self.gen: Any = None

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.gen = user_config.get("gen")
        report = {"gen": self.gen, "pid": os.getpid(), "t": time.time()}
        self._redis.rpush(self._key, orjson.dumps(report))

    def __call__(self, body: Any) -> Any:
        return body


# -- the stream bench's cancellation probes (bench/stream_bench.py) --------------------------------------------
#
# Each request's body names two Redis lists of the farm's Redis (the replica's REDIS_URL): ``started``, pushed when
# the handler runs, and ``cancelled``, pushed the handler's wall clock (time.time()) when asyncio.CancelledError
# reaches it. The bench closes its connection, noting its own clock, and subtracts.

_report: redis.Redis | None = None
_report_lock = threading.Lock()


def _reports() -> redis.Redis:
    global _report
    with _report_lock:
        if _report is None:
            _report = redis.Redis.from_url(os.environ["REDIS_URL"])
        return _report


async def _wait_for_cancel(body: dict[str, Any]) -> None:
    """Wait ``wait_s``; on CancelledError, report when it came, then let it go on."""
    try:
        await asyncio.sleep(float(body.get("wait_s", 10)))
    except asyncio.CancelledError:
        seen = time.time()
        _reports().rpush(body["cancelled"], repr(seen))
        raise


async def wait_cancelled(body: dict[str, Any]) -> str:
    """An async unary handler: says it started, then waits to be cancelled (its caller hangs up)."""
    _reports().rpush(body["started"], b"1")
    await _wait_for_cancel(body)
    return "not cancelled"


async def chunk_then_wait_cancelled(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """An async generator: yields one chunk (its caller then knows it runs), then waits to be cancelled."""
    yield stream_chunks.chunk(0)
    await _wait_for_cancel(body)


class MuxModels:
    """The multiplex bench's deployment (bench/multiplex_bench.py): four models a replica, each load taking
    ``load_s`` and counted on a counter in the farm's Redis that the bench reads; a request takes ``work_s``."""

    def __init__(self, report_key: str, load_s: float, work_s: float) -> None:
        self._redis = redis.Redis.from_url(os.environ["REDIS_URL"])
        self._key = report_key
        self._load_s = load_s
        self._work_s = work_s

    @streamserve.multiplexed(max_models_per_replica=4)
    async def get_model(self, model_id: str) -> str:
        await asyncio.to_thread(self._redis.incr, self._key)
        await asyncio.sleep(self._load_s)
        return model_id

    async def __call__(self, body: Any) -> Any:
        model = await self.get_model(streamserve.model_id())
        await asyncio.sleep(self._work_s)
        return model
