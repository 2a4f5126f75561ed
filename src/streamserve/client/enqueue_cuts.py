"""Calls still waiting for their enqueue when their deadline passes: the deadline cuts the wait.

A Redis that stops answering without closing the connection (a stopped process, a host that drops packets) held an
enqueue's round trip for the socket timeout and the connection's retries, half a minute and more, whatever the call's
own timeout. At the deadline the call's timer now cancels the caller's wait instead, and the call raises
RedisUnavailableError (RequestTimeoutError for a timeout too short for any Redis: calls.ENQUEUE_STALL_S). The round
trip goes on for the other calls in it; should Redis queue the request after all, it is cancelled then (Pipeliner's
``abandoned``; a round trip sent again only looks for it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from streamserve.wire.errors import StreamServeError


class EnqueueCuts:
    """The tasks waiting for an enqueue, by call tag, and the errors of those whose deadline cut the wait."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Task[Any]] = {}
        self._cut: dict[str, StreamServeError] = {}

    def waiting(self, tag: str) -> None:
        """The current task starts waiting for call ``tag``'s enqueue."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting[tag] = task

    def arrived(self, tag: str) -> None:
        """Call ``tag``'s wait for its enqueue is over, however it ended."""
        self._waiting.pop(tag, None)

    def waits(self, tag: str) -> bool:
        """Whether call ``tag`` waits for its enqueue."""
        return tag in self._waiting

    def cut(self, tag: str, error: StreamServeError) -> None:
        """Call ``tag``'s deadline passed while it waits for its enqueue: stop the wait, with ``error``."""
        task = self._waiting.pop(tag, None)
        if task is not None:
            self._cut[tag] = error
            task.cancel()

    def error(self, tag: str) -> StreamServeError | None:
        """In the task whose wait for call ``tag``'s enqueue was cancelled: the error to raise instead, when the
        deadline cut it and nothing else cancelled the task too (None: a cancellation to let through)."""
        error = self._cut.pop(tag, None)
        if error is None:
            return None
        task = asyncio.current_task()
        if task is not None and task.uncancel() > 0:
            return None
        return error
