"""What a handler raises that is no Exception, kept from ending the replica, and an exception's text that cannot fail.

A handler may raise SystemExit (``sys.exit()``), KeyboardInterrupt or a BaseException of its own. asyncio re-raises
the first two out of the event loop when a task raises them, and a task awaiting a future that holds one raises it in
turn: the replica exited, and its request ran again on the next replica, and again (until dead-lettered). A handler's
own CancelledError, raised without anyone cancelling it, ended its task as cancelled: read as the replica stopping,
the request stayed pending and unanswered. Each is carried as a HandlerExit (an Exception) instead, and answered as
the handler's error, under its own type's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class HandlerExit(Exception):
    """A handler raised ``raised``, a BaseException that is no Exception."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(exception_text(raised))
        self.raised = raised


def what_was_raised(exc: BaseException) -> BaseException:
    """``exc``, or what a HandlerExit carries."""
    return exc.raised if isinstance(exc, HandlerExit) else exc


def as_exception(exc: BaseException) -> Exception:
    """``exc`` as an Exception a future may hold and a task may raise without ending the event loop."""
    return exc if isinstance(exc, Exception) else HandlerExit(exc)


async def contained(awaitable: Awaitable[Any]) -> Any:
    """Await an async handler's coroutine; what it raises that is no Exception comes out as a HandlerExit, but a
    cancellation of the task that runs it (the request cancelled, its deadline, the replica closing)."""
    try:
        return await awaitable
    except Exception:
        raise
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # cancelled from outside
        raise HandlerExit(exc) from exc
    except BaseException as exc:
        raise HandlerExit(exc) from exc


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or what says it could not be made: a ``__str__`` that raises must not keep a request from its
    answer (its reply was never sent, and its slot never freed)."""
    try:
        return str(exc)
    except Exception as failure:
        return f"(its message cannot be shown: str() raised {type(failure).__name__})"
