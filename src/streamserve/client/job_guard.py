"""What a job worker runs: streamserve's own job function, called as ``JobQueue.enqueue`` calls it, nothing else.

RQ keeps a job in Redis as the dotted name of a function with its arguments, and a worker imports and calls
whatever name it finds there; it also imports and calls the job's success, failure and stopped callbacks (RQ's
registry cleanup does too, in whichever process sweeps), and sends its webhooks. So anyone who can write to the
jobs' Redis could make a worker run ``os.system``. ``GuardedJob``, the job class of our job workers and of our
queue, runs JOB_FUNCTION only, with the arguments we queue; it never imports a callback and never sends a webhook
(we set neither). Any other job fails, without anything it names being imported: ``JobRefusedError`` says why, in
the job's error and in the worker's log, and the worker goes on with the next job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rq.exceptions import DeserializationError
from rq.job import Job, JobStatus

from streamserve.wire.models import MODEL_ID_RE
from streamserve.wire.priorities import Priority
from streamserve.wire.tenants import DEFAULT_TENANT, TENANT_RE

logger = logging.getLogger(__name__)

# The one function a job may name (a string, so that enqueueing imports no worker code).
JOB_FUNCTION = "streamserve.workers.job_function.run"

# How much of a refused job's function or callback name the refusal shows (the name is whatever was written).
SHOWN_CHARS = 200


class JobRefusedError(Exception):
    """A job that is not a call of JOB_FUNCTION as streamserve queues it; it fails without running."""


class GuardedJob(Job):
    """RQ's Job, which refuses to be anything but a call of JOB_FUNCTION."""

    def refusal(self) -> str | None:
        """Why this job must not run; None when it is a call of JOB_FUNCTION as ``JobQueue.enqueue`` makes it."""
        try:
            func_name, instance, args, kwargs = self.func_name, self.instance, self.args, self.kwargs
        except DeserializationError:
            return "its payload is not a job RQ's JSON serializer can read"
        if func_name != JOB_FUNCTION or instance is not None:
            on = f" on an instance of {type(instance).__name__}" if instance is not None else ""
            return f"it names {_shown(func_name)}{on}, not {JOB_FUNCTION!r}"
        if not _are_run_arguments(args, kwargs):
            shape = "(name, body, method, timeout, priority, tenant, model)"
            return f"its arguments are not {shape} as streamserve queues them"
        callbacks = [
            n for n in (self._success_callback_name, self._failure_callback_name, self._stopped_callback_name) if n
        ]
        if callbacks:
            return f"it carries callbacks ({', '.join(map(_shown, callbacks))}), which streamserve never sets"
        if self.webhooks:
            return "it carries webhooks, which streamserve never sets"
        return None

    @property
    def func(self) -> Callable[..., Any]:
        """The job function; JobRefusedError, before importing anything, for a job that names something else."""
        refusal = self.refusal()
        if refusal is not None:
            logger.error("job %s refused, it fails without running: %s", self.id, refusal)
            raise JobRefusedError(f"job {self.id} refused: {refusal}")
        func: Callable[..., Any] = super().func
        return func

    @property
    def should_retry(self) -> bool:
        """A refused job is refused again: it is not retried, whatever retries it asks for."""
        return bool(super().should_retry) and self.refusal() is None

    # Never import a callback that a job names: streamserve sets none, so any is someone else's.
    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, status: str | JobStatus, *, exc_string: str | None = None) -> None:
        """Send none: streamserve sets none, so any is someone else's (a request to an address of their choosing)."""


def _shown(value: object) -> str:
    """``value`` as it can be logged: its repr (no control characters), cut to SHOWN_CHARS."""
    shown = repr(value)
    return shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "...(cut)"


def _are_run_arguments(args: Any, kwargs: Any) -> bool:
    """Whether ``run(*args, **kwargs)`` is ``run(name, body, method, timeout, priority, tenant, model)`` with the types
    JobQueue gives them (jobs queued by older releases leave the last ones out)."""
    if kwargs != {} or not isinstance(args, list | tuple) or not 2 <= len(args) <= 7:
        return False
    given: list[Any] = list(args)
    defaults = ["", None, Priority.NORMAL.value, DEFAULT_TENANT, ""]  # run's, for what is left out
    name, _body, method, timeout, priority, tenant, model = given + defaults[len(given) - 2 :]
    is_number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    is_priority = priority in {p.value for p in Priority}
    is_tenant = isinstance(tenant, str) and TENANT_RE.match(tenant) is not None
    is_model = model == "" or (isinstance(model, str) and MODEL_ID_RE.match(model) is not None)
    named = isinstance(name, str) and isinstance(method, str)
    return named and (timeout is None or is_number) and is_priority and is_tenant and is_model
