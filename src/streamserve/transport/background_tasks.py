"""Tasks that outlive whoever starts them (a client's reply reader, its config long poll), started in a context of
their own.

asyncio copies the starting task's context into a new task: a reader started by a client's first call carried that
call's trace (and, in a handler, its request scope) for as long as the client lived, and every line it logged (a
Redis outage, years later) named that first call's trace id.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def background_task(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """``coro`` as a task on the running loop, in a fresh context (no trace, no request of its starter's)."""
    return asyncio.create_task(coro, name=name, context=contextvars.Context())
