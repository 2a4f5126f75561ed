"""A task that outlives whoever starts it carries nothing of its starter's context (its trace, its request)."""

from __future__ import annotations

import asyncio
import contextvars

from streamserve.transport.background_tasks import background_task

STARTERS = contextvars.ContextVar[str]("starters", default="none")


async def seen() -> str:
    return STARTERS.get()


async def test_a_background_task_does_not_see_the_context_of_the_call_that_started_it() -> None:
    STARTERS.set("the first call's trace")
    assert await asyncio.create_task(seen()) == "the first call's trace"  # (what asyncio does by itself)
    assert await background_task(seen(), "reader") == "none"
