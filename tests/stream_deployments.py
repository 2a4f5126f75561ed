"""Streaming deployments used by the tests (imported by in-process replicas as ``tests.stream_deployments:...``).

The module-level records below are how a test sees what a generator did inside the replica: how far it got, and
whether its ``finally`` ran.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import streamserve

# How many chunks each tagged generator has yielded (counted just before each ``yield``), in this process.
YIELDED: Counter[str] = Counter()
# The tags of the generators whose ``finally`` ran, in this process.
FINALLY_RAN: set[str] = set()
# How many times any generator here was started, in this process.
STARTED: Counter[str] = Counter()
ENDED: Counter[str] = Counter()  # generators that yielded their last chunk


def reset() -> None:
    YIELDED.clear()
    FINALLY_RAN.clear()
    STARTED.clear()
    ENDED.clear()


def count_to(n: int) -> Iterator[dict[str, int]]:
    """Sync: ``{"i": 0}`` .. ``{"i": n-1}``."""
    STARTED["count_to"] += 1
    for i in range(n):
        yield {"i": i}
    ENDED["count_to"] += 1


async def acount_to(n: int) -> AsyncIterator[dict[str, int]]:
    """Async: ``{"i": 0}`` .. ``{"i": n-1}``, without waiting in between."""
    STARTED["acount_to"] += 1
    for i in range(n):
        yield {"i": i}
    ENDED["acount_to"] += 1


class Tokens:
    """A class whose ``__call__`` and a method stream."""

    def __init__(self, prefix: str = "t") -> None:
        self.prefix = prefix

    def __call__(self, n: int) -> Iterator[str]:
        for i in range(n):
            yield f"{self.prefix}{i}"

    async def spell(self, word: str) -> AsyncIterator[str]:
        for letter in word:
            await asyncio.sleep(0)
            yield letter

    def unary(self, body: Any) -> Any:
        return body


def fail_after(n: int) -> Iterator[int]:
    """Yields 0..n-1, then raises."""
    yield from range(n)
    raise ValueError(f"boom after {n}")


def nan_at_3(kind: str) -> Iterator[Any]:
    """Yields 0, 1, 2, then a chunk JSON cannot hold: ``nan`` or a set."""
    try:
        yield from range(3)
        yield float("nan") if kind == "nan" else {1, 2}
        yield 4  # never reached
    finally:
        FINALLY_RAN.add(f"nan_at_3:{kind}")


def sized(sizes: list[int]) -> Iterator[str]:
    """One string of each size."""
    for size in sizes:
        yield "x" * size


async def async_stuck_after(n: int) -> AsyncIterator[int]:
    """Yields n chunks, then waits for a minute (its deadline comes first)."""
    try:
        for i in range(n):
            YIELDED["async_stuck"] += 1
            yield i
        await asyncio.sleep(60)
        yield -1
    finally:
        FINALLY_RAN.add("async_stuck")


def sync_slow(interval_s: float) -> Iterator[int]:
    """Yields a chunk every ``interval_s`` for a minute at most (its deadline comes first)."""
    try:
        for i in range(int(60 / interval_s)):
            YIELDED["sync_slow"] += 1
            yield i
            time.sleep(interval_s)
    finally:
        FINALLY_RAN.add("sync_slow")


def sync_until_cancelled(interval_s: float) -> Iterator[int]:
    """Yields a chunk, then works in steps of ``interval_s`` until ``streamserve.cancelled()`` says to stop, and
    returns (as the docs' sync loops do): it never reaches another yield."""
    YIELDED["sync_until_cancelled"] += 1
    yield 0
    while not streamserve.cancelled():
        time.sleep(interval_s)
    FINALLY_RAN.add("sync_until_cancelled")


def sync_flow(n: int) -> Iterator[int]:
    """Yields n chunks as fast as it may, counting each."""
    try:
        for i in range(n):
            YIELDED["sync_flow"] += 1
            yield i
    finally:
        FINALLY_RAN.add("sync_flow")


async def async_flow(n: int) -> AsyncIterator[int]:
    """Yields n chunks as fast as it may, counting each."""
    try:
        for i in range(n):
            YIELDED["async_flow"] += 1
            yield i
    finally:
        FINALLY_RAN.add("async_flow")


class BatchedStream:
    """Not servable: a batched method that yields (the loader refuses it)."""

    @streamserve.batch(max_batch_size=4)
    def predict(self, bodies: list[int]) -> Iterator[list[int]]:
        yield bodies


@streamserve.batch
def batched_generator(bodies: list[int]) -> Iterator[list[int]]:
    """Not servable: a batched function that yields (the loader refuses it)."""
    yield bodies
