"""Waiting on a condition, for the tests and the benches: poll until it holds, at most a bound, else fail saying what.

A test never sleeps to let something happen: it waits here for the state it needs. ``wait_for`` polls a plain
function (from sync code or a thread); ``wait_for_async`` polls a function or a coroutine function from the event
loop without blocking it. Both take the bound explicitly, fail with an AssertionError that names what never
happened, and return how long the wait took (a bench may report it).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

# What never happened: a text, or a function that writes it once the wait has failed (a log read then, not before).
Message = str | Callable[[], str]


def _timed_out(condition: Callable[..., object], message: Message | None, timeout_s: float) -> AssertionError:
    if message is None:
        text = f"{getattr(condition, '__qualname__', repr(condition))} never held"
    else:
        text = message() if callable(message) else message
    return AssertionError(f"{text} (waited {timeout_s:g} s)")


def wait_for(
    condition: Callable[[], object], timeout_s: float, message: Message | None = None, interval_s: float = 0.1
) -> float:
    """Call ``condition`` every ``interval_s`` until it returns something true; the seconds that took.

    Raises AssertionError with ``message`` if it has not within ``timeout_s``.
    """
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started >= timeout_s:
            raise _timed_out(condition, message, timeout_s)
        time.sleep(interval_s)
    return time.monotonic() - started


async def wait_for_async(
    condition: Callable[[], object | Awaitable[object]],
    timeout_s: float,
    message: Message | None = None,
    interval_s: float = 0.02,
) -> float:
    """``wait_for`` on the event loop: ``condition`` may be sync or async, and the loop runs between calls."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return loop.time() - started
        if loop.time() - started >= timeout_s:
            raise _timed_out(condition, message, timeout_s)
        await asyncio.sleep(interval_s)
