"""The requests a replica holds, counted twice over: while their handler runs, and until they are finished."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class Slots:
    """``executing``: read, handler not yet returned; at most max_ongoing_requests, the read loop's bound.
    ``held``: read, not yet replied and acknowledged; the heartbeat reports it and the drain waits for none.
    ``holds(entry_id)``: whether that entry is among them (after a lost read, the replica tells what it
    holds from what Redis delivered it but it never received).

    A request gives its slot back when its handler returns, before its reply
    goes out, so the next read overlaps the reply's round trip.
    """

    def __init__(self) -> None:
        self.executing = 0
        self._held: set[bytes] = set()
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def free(self, limit: int) -> int:
        """How many more requests may be read now, under ``limit`` (max_ongoing_requests)."""
        return limit - self.executing

    @property
    def held(self) -> int:
        return len(self._held)

    def holds(self, entry_id: bytes) -> bool:
        return entry_id in self._held

    def take(self, entry_id: bytes) -> None:
        """A request was read."""
        self._held.add(entry_id)
        self.executing += 1
        self._idle.clear()

    def handler_returned(self) -> None:
        self.executing -= 1
        self._room.set()

    def finished(self, entry_ids: Iterable[bytes]) -> None:
        """These requests were replied to and acknowledged (or given up on: they stay pending in Redis)."""
        self._held.difference_update(entry_ids)
        if not self._held:
            self._idle.set()

    def wake(self) -> None:
        """Wake a read loop waiting for room: the limit changed, or the replica is stopping."""
        self._room.set()

    async def wait_for_room(self) -> None:
        self._room.clear()
        await self._room.wait()

    async def wait_idle(self) -> None:
        await self._idle.wait()
