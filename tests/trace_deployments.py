"""Deployments for tests/e2e/test_tracing.py: a parent that calls a child through a handle (async and sync), a
handler that raises, a stream, a batched handler and a slow one (to cancel)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import trace

import streamserve

logger = logging.getLogger("tests.trace_deployments")


async def child(body: Any) -> Any:
    """Logs a line (which carries the trace id) and says which trace it ran in (as the user's code sees it)."""
    logger.info("traced child serving %s", body)
    return {"echo": body, "trace_id": format(trace.get_current_span().get_span_context().trace_id, "032x")}


async def parent(body: Any) -> Any:
    return {"child": await streamserve.handle("traced-child").acall(body)}


def parent_sync(body: Any) -> Any:
    return {"child": streamserve.handle("traced-child").call(body)}


def fails(body: Any) -> Any:
    raise ValueError(f"no good: {body}")


async def tokens(body: dict[str, float]) -> AsyncIterator[int]:
    """``n`` chunks, then (``then_wait_s``) a wait for nothing: a stream its deadline cuts."""
    for index in range(int(body["n"])):
        yield index
    await asyncio.sleep(body.get("then_wait_s", 0))


@streamserve.batch(max_batch_size=4, batch_wait_timeout_s=0.5)
async def batched(bodies: list[Any]) -> list[Any]:
    return bodies


async def slow(body: dict[str, float]) -> Any:
    await asyncio.sleep(body["sleep_s"])
    return "done"


def sync_slow(body: dict[str, float]) -> Any:
    """Sleeps in steps until cancelled (streamserve.cancelled()) or ``sleep_s`` passed."""
    ends = time.monotonic() + body["sleep_s"]
    while time.monotonic() < ends and not streamserve.cancelled():
        time.sleep(0.02)
    return "done"
