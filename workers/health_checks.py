"""The replica's calls of its deployment's ``check_health()``: every ``health_check_period_s``, each bounded.

A sync check runs on a thread of its own, never on the handler threads: a
check that hangs takes no request slot, holds no lock the requests need, and
(a daemon thread) cannot keep the process from exiting. An async check runs
on the loop under a timeout; one that blocks the loop itself (``time.sleep``
inside ``async def``) blocks everything, as any blocking async handler does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable

from streamserve.workers.contained import as_exception, contained, exception_text, what_was_raised
from streamserve.workers.loader import Handler


async def call_check(check: Handler, timeout_s: float) -> str:
    """Call ``check`` once: "" when it returned in time, else why not (for the heartbeat and ``status``)."""
    try:
        async with asyncio.timeout(timeout_s):
            if check.is_async:
                await contained(check.fn())
            else:
                await _on_own_thread(check.fn)
    except TimeoutError:
        return f"check_health() did not answer within {timeout_s:g}s"
    except Exception as exc:  # (sys.exit() in it too, as a HandlerExit: the replica goes on)
        raised = what_was_raised(exc)
        return f"check_health() raised {type(raised).__name__}: {exception_text(raised)}"
    return ""


def _on_own_thread(fn: Callable[[], object]) -> Awaitable[object]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(as_exception(error))
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # handed to the loop, where call_check says what it was
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the replica has exited meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="check-health", daemon=True).start()
    return done


async def watch_health(
    check: Handler, period_s: Callable[[], float], timeout_s: Callable[[], float], stopping: asyncio.Event
) -> str:
    """Call ``check`` every ``period_s()`` until it fails (return why) or ``stopping`` is set (return "").

    The period and timeout are read before each call: a config change applies from the next one on.
    """
    while True:
        try:
            await asyncio.wait_for(stopping.wait(), period_s())
            return ""
        except TimeoutError:
            pass
        problem = await call_check(check, timeout_s())
        if problem:
            return problem
