"""The request a handler is serving, as code running inside the handler sees it: ``streamserve.cancelled()``, and
the deadline and cancellation that handles (streamserve.handle) pass on to the calls they make.

The replica makes one RequestScope per request it runs and runs the handler in a context (contextvars) that holds
it: an async handler's task, a sync handler's call on its thread, a generator's whole iteration. Code outside any
handler sees no scope: ``cancelled()`` is False there, and a handle's calls have no parent.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry.context import Context

from streamserve.runtime.trace_context import attach, detach
from streamserve.wire.messages import now_ms
from streamserve.wire.priorities import Priority
from streamserve.wire.tenants import DEFAULT_TENANT

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("streamserve_request", default=None)
# Guards every scope's list of children (calls made through handles, registered from handler threads).
_CHILDREN_LOCK = threading.Lock()


class RequestScope:
    """One request being served: its id, its deadline, whether it was cancelled, and how to stop what serves it.

    ``cancel`` runs on the replica's event loop; ``cancelled`` and ``on_cancel`` may be called from any thread.
    """

    __slots__ = (
        "_children",
        "deadline_ms",
        "deadline_stop",
        "is_cancelled",
        "made_calls",
        "model",
        "on_call",
        "on_reader_wait",
        "priority",
        "reader_waits",
        "request_id",
        "stop",
        "stopped_overdue",
        "tenant",
        "trace",
    )

    def __init__(
        self,
        request_id: str,
        deadline_ms: int,
        priority: Priority = Priority.NORMAL,
        tenant: str = DEFAULT_TENANT,
        model: str = "",
    ) -> None:
        self.request_id = request_id
        self.deadline_ms = deadline_ms  # epoch ms; 0: none
        # Its calls through handles go at the same level, for the same tenant.
        self.priority = priority
        self.tenant = tenant
        self.model = model  # the model it names (streamserve.model_id()), "" for none: handles' calls name their own
        self.is_cancelled = False
        # Stops the handler when the request is cancelled (cancels its task, closes its generator); None for a sync
        # handler, which cannot be interrupted and is told by ``cancelled()`` instead.
        self.stop: Callable[[], object] | None = None
        # Stops the handler when its deadline passes (an async handler's task; a stream watches its own deadline).
        self.deadline_stop: Callable[[], object] | None = None
        self.stopped_overdue = False  # deadline_stop was called
        # Whether the handler has called a deployment through a handle, which may wait for the replica to read, and
        # what to call (on the replica's loop) when it first does (workers/serving.py, _run_alone).
        self.made_calls = False
        self.on_call: Callable[[], object] | None = None
        # Whether its stream is paused now, for its caller to read on (which may not come for long), and what to call
        # (on the replica's loop) when it pauses: set for a request run alone (workers/serving.py, _run_alone).
        self.reader_waits = False
        self.on_reader_wait: Callable[[], object] | None = None
        self._children: list[Callable[[], object]] | None = None
        # When the replica traces: the trace context of the request's handler span, current while the handler runs
        # (the user's own spans, and the calls it makes through handles, are its children); else None.
        self.trace: Context | None = None

    def cancelled(self) -> bool:
        """Whether the request was cancelled or its deadline has passed: the handler's work is wanted no more."""
        return self.is_cancelled or 0 < self.deadline_ms <= now_ms()

    def remaining_s(self) -> float | None:
        """Seconds until the deadline (0 once passed); None when the request has none."""
        if not self.deadline_ms:
            return None
        return max(0.0, (self.deadline_ms - now_ms()) / 1000)

    def stop_overdue(self) -> None:
        """Its deadline has passed: stop the handler, if that is how it stops then (an async handler's task)."""
        stop, self.deadline_stop = self.deadline_stop, None
        if stop is not None:
            self.stopped_overdue = True
            stop()

    def cancel(self) -> None:
        """Cancel the request: mark it, stop its handler where that can be done, cancel the calls it made."""
        if self.is_cancelled:
            return
        self.is_cancelled = True
        if self.stop is not None:
            self.stop()
        with _CHILDREN_LOCK:
            children, self._children = self._children, None
        for cancel_child in children or ():
            cancel_child()

    def on_cancel(self, cancel_child: Callable[[], object]) -> Callable[[], None]:
        """Call ``cancel_child`` when this request is cancelled (at once if it is already); returns what unregisters
        it (the child ended)."""
        with _CHILDREN_LOCK:
            if not self.is_cancelled:
                if self._children is None:
                    self._children = []
                self._children.append(cancel_child)
                return lambda: self._forget_child(cancel_child)
        cancel_child()
        return _nothing

    def _forget_child(self, cancel_child: Callable[[], object]) -> None:
        with _CHILDREN_LOCK:
            if self._children is not None and cancel_child in self._children:
                self._children.remove(cancel_child)

    def context(self) -> contextvars.Context:
        """A copy of the current context in which this scope is the current one (to run the handler in)."""
        ctx = contextvars.copy_context()
        ctx.run(_CURRENT.set, self)
        if self.trace is not None:
            ctx.run(attach, self.trace)
        return ctx


def _nothing() -> None:
    return None


def run_in(scope: RequestScope, fn: Callable[[Any], T], arg: Any) -> T:
    """``fn(arg)`` with ``scope`` current, on a handler thread: what a sync handler's call is. (Set and reset in the
    thread's own context: cheaper than a copy of the loop's, which a thread would not see anyway.)"""
    token = _CURRENT.set(scope)
    traced = attach(scope.trace) if scope.trace is not None else None
    try:
        return fn(arg)
    finally:
        if traced is not None:
            detach(traced)
        _CURRENT.reset(token)


def current_scope() -> RequestScope | None:
    """The request the calling code serves, or None outside a handler."""
    return _CURRENT.get()


def cancelled() -> bool:
    """Inside a handler: whether the request it serves was cancelled (its caller left, its job was cancelled) or
    its deadline has passed, so that its work is wanted no more. False outside a handler.

    A sync handler cannot be interrupted: it can check this in its loop and stop early. It turns True within
    100 ms of the cancellation. (An async handler's task gets ``asyncio.CancelledError``; a generator is closed.)
    """
    scope = _CURRENT.get()
    return scope is not None and scope.cancelled()
