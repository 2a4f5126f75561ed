"""Deployments that call one another through handles, for tests/e2e/test_handles.py.

They run in replica processes: what a test must see of them besides their answer (that a child started, that it was
cancelled, what the parent's code raised) goes to the Redis list named by ``body["notes"]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis

import streamserve
from streamserve.runtime.request_scope import current_scope


def _served() -> dict[str, Any]:
    """The request the calling handler serves, as it sees it."""
    scope = current_scope()
    assert scope is not None
    return {"request_id": scope.request_id, "deadline_ms": scope.deadline_ms}


def _note(body: dict[str, Any], text: str) -> None:
    with redis.Redis.from_url(os.environ["REDIS_URL"]) as notes:
        notes.rpush(body["notes"], text)


async def child(body: dict[str, Any]) -> dict[str, Any]:
    """Says which request it serves; with ``sleep_s``, sleeps first (noting that it started, and if it is
    cancelled)."""
    if "sleep_s" in body:
        _note(body, f"child started {_served()['request_id']}")
        try:
            await asyncio.sleep(body["sleep_s"])
        except asyncio.CancelledError:
            _note(body, "child cancelled")
            raise
    return {"served": _served(), "echo": body.get("echo")}


async def parent_async(body: dict[str, Any]) -> dict[str, Any]:
    """Calls ``child`` with its own body and returns both what it served and the child's answer."""
    answer = await streamserve.handle("child").acall(body)
    return {"served": _served(), "child": answer}


def parent_sync(body: dict[str, Any]) -> dict[str, Any]:
    """``parent_async`` as a sync handler."""
    try:
        answer = streamserve.handle("child").call(body)
    except streamserve.RequestCancelledError:
        _note(body, "parent saw RequestCancelledError")
        raise
    return {"served": _served(), "child": answer}


def parent_threads(body: dict[str, Any]) -> dict[str, Any]:
    """Fans out to ``child`` from threads of its own, each call run in a copy of the handler's context (the recipe in
    docs/api.md: a thread does not inherit it)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(contextvars.copy_context().run, streamserve.handle("child").call, body) for _ in "ab"]
        return {"served": _served(), "children": [call.result() for call in calls]}


async def blocking_call_in_async(body: dict[str, Any]) -> Any:
    """Wrong: the sync ``call`` on the replica's event loop."""
    return streamserve.handle("child").call(body)


def tokens(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``body["n"]`` chunks, each saying which request made it."""
    for i in range(int(body["n"])):
        yield {"i": i, "request_id": _served()["request_id"]}


async def slow_tokens(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """One chunk, then nothing for 30 s (noting that it started, and if it is cancelled)."""
    yield {"i": 0, "request_id": _served()["request_id"]}
    _note(body, f"child started {_served()['request_id']}")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _note(body, "child cancelled")
        raise
    yield {"i": 1, "request_id": _served()["request_id"]}


def parent_stream_sync(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Streams what ``body["child"]`` (default ``tokens``) streams."""
    try:
        yield from streamserve.handle(body.get("child", "tokens")).stream(body)
    except streamserve.RequestCancelledError:
        _note(body, "parent saw RequestCancelledError")
        raise


def first_chunk_sync(body: dict[str, Any]) -> Any:
    """Reads the first chunk of what ``body["child"]`` streams and leaves the loop; then waits (5 s at most) for the
    child to note that it was cancelled, while this request still runs (so no collector of its ended scope did it)."""
    first = None
    for chunk in streamserve.handle(body["child"]).stream(body):
        first = chunk
        break
    if first is None:
        return None
    deadline = time.monotonic() + 5
    with redis.Redis.from_url(os.environ["REDIS_URL"]) as notes:
        while b"child cancelled" not in notes.lrange(body["notes"], 0, -1) and time.monotonic() < deadline:
            time.sleep(0.02)
        cancelled = b"child cancelled" in notes.lrange(body["notes"], 0, -1)
    return {**first, "child_cancelled_while_parent_ran": cancelled}


def late_caller(body: dict[str, Any]) -> Any:
    """Sleeps ``sleep_s`` (past its deadline, in the test), then calls ``child``: notes what that raised."""
    time.sleep(body["sleep_s"])
    try:
        return streamserve.handle("child").call(body)
    except Exception as exc:
        _note(body, f"late call raised {type(exc).__name__}")
        raise


def late_streamer(body: dict[str, Any]) -> Iterator[Any]:
    """``late_caller`` as a sync generator that has yielded a chunk first."""
    yield {"i": 0}
    time.sleep(body["sleep_s"])
    try:
        yield from streamserve.handle("tokens").stream({"n": 1})
    except Exception as exc:
        _note(body, f"late call raised {type(exc).__name__}")
        raise


async def parent_stream_async(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """``parent_stream_sync`` as an async generator."""
    async for chunk in streamserve.handle(body.get("child", "tokens")).astream(body):
        yield chunk


async def recursive(body: dict[str, Any]) -> dict[str, Any]:
    """Calls itself through a handle ``depth`` times; the innermost call notes that it started and waits while the
    body's ``hold`` key exists (30 s at most)."""
    if body["depth"] > 0:
        inner = await streamserve.handle("recursive").acall({**body, "depth": body["depth"] - 1})
        return {"depth": body["depth"], "inner": inner}
    _note(body, f"innermost started {_served()['request_id']}")
    with redis.Redis.from_url(os.environ["REDIS_URL"]) as store:
        for _ in range(1500):
            if not store.exists(body["hold"]):
                break
            await asyncio.sleep(0.02)
    return {"depth": 0}
