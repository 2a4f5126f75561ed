"""A job worker sent SIGTERM the moment it has taken a job: ``python -m tests.integration.signalled_job_worker``.

The real job worker (``workers.job_worker.main``), with RQ's dequeue wrapped so that the process signals itself as
soon as Redis has moved a job to it, before it runs the job: the moment in which a Ctrl-C under ``up`` once lost a
job (it stayed 'queued', in no queue).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from rq.queue import Queue

from streamserve.workers import job_worker

_dequeue_any = Queue.dequeue_any.__func__  # type: ignore[attr-defined]


def _dequeue_then_sigterm(cls: type[Queue], *args: Any, **kwargs: Any) -> Any:
    taken = _dequeue_any(cls, *args, **kwargs)
    if taken is not None:
        os.kill(os.getpid(), signal.SIGTERM)
    return taken


if __name__ == "__main__":
    Queue.dequeue_any = classmethod(_dequeue_then_sigterm)  # type: ignore[method-assign,assignment]
    raise SystemExit(job_worker.main([]))
