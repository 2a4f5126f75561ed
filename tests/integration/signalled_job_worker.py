"""A job worker sent a signal the moment it has taken a job: ``python -m tests.integration.signalled_job_worker
[SIGNAL]`` (SIGTERM by default, or SIGKILL).

The real job worker (``workers.job_worker.main``), with RQ's dequeue wrapped so that the process signals itself as
soon as Redis has moved a job to it, before it runs the job: the moment in which a Ctrl-C under ``up`` once lost a
job (it stayed 'queued', in no queue), and in which a kill -9 strands the job in RQ's intermediate list.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from rq.queue import Queue

from streamserve.workers import job_worker

_dequeue_any = Queue.dequeue_any.__func__  # type: ignore[attr-defined]


SIGNAL = signal.Signals[sys.argv[1]] if len(sys.argv) > 1 else signal.SIGTERM


def _dequeue_then_signal(cls: type[Queue], *args: Any, **kwargs: Any) -> Any:
    taken = _dequeue_any(cls, *args, **kwargs)
    if taken is not None:
        os.kill(os.getpid(), SIGNAL)
    return taken


if __name__ == "__main__":
    Queue.dequeue_any = classmethod(_dequeue_then_signal)  # type: ignore[method-assign,assignment]
    raise SystemExit(job_worker.main([]))
