"""The job worker pool: ``job_workers`` RQ worker processes that the leading scheduler keeps running.

Unlike replicas, job workers are plain children in the scheduler's own process
group, because they hold no state worth outliving the scheduler for: whatever
stops the scheduler's group (``streamserve up`` on Ctrl-C, or its SIGKILL)
stops them too, and the kernel sends them SIGTERM if the scheduler dies
(``die_with_parent``). A job whose worker was killed stays "started" until its
execution's heartbeat (the job's timeout plus a minute) has expired and a
worker's periodic registry maintenance (every 10 minutes) or ``rq info`` runs:
then RQ fails it with ``AbandonedJobError``. It is never left "started" for ever.

SIGTERM is RQ's warm shutdown: finish the current job, then exit. RQ ignores a
second SIGTERM within a second, so the group-wide signal and our own do not
add up to a cold shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time

from streamserve.backoff import Backoff
from streamserve.procs import die_with_parent, role_command
from streamserve.settings import Settings

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 1.0
# A worker that keeps dying (Redis gone, a broken install) is restarted at most this rarely.
MAX_BACKOFF_S = 30.0
# A pool with no death for this long starts restarting without delay again.
CALM_AFTER_S = 60.0


class JobWorkerPool:
    """Starts, restarts and stops ``settings.job_workers`` processes of ``streamserve job-worker``."""

    def __init__(self, settings: Settings) -> None:
        self.size = settings.job_workers
        self._env = {**os.environ, **settings.to_env()}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._signalled: set[int] = set()
        self._backoff = Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
        self._not_before = 0.0
        self._last_death = 0.0

    @property
    def pids(self) -> list[int]:
        """The workers that run now (stopping ones included)."""
        return [p.pid for p in self._procs if p.poll() is None]

    def keep_running(self) -> None:
        """Reap the workers that exited and start what is missing (called on each tick while leading)."""
        self._reap()
        now = time.monotonic()
        if now - self._last_death > CALM_AFTER_S:
            self._backoff.reset()
        if now < self._not_before:
            return
        while len(self._procs) - len(self._signalled) < self.size:
            cmd = role_command("job-worker")
            proc = subprocess.Popen(cmd, env=self._env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
            self._procs.append(proc)
            logger.info("job worker started (pid %d)", proc.pid)

    def stop(self) -> None:
        """Ask every worker to finish its job and exit (RQ's warm shutdown); idempotent."""
        self._reap()
        for proc in self._procs:
            if proc.pid not in self._signalled:
                self._signalled.add(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End every worker still running at once."""
        for proc in self._procs:
            if proc.poll() is None:
                logger.warning("job worker (pid %d) did not stop in time: killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        self._reap()

    def _reap(self) -> None:
        for proc in [p for p in self._procs if p.poll() is not None]:
            self._procs.remove(proc)
            if proc.pid in self._signalled:
                self._signalled.discard(proc.pid)
                continue
            self._last_death = time.monotonic()
            delay = self._backoff.next()
            self._not_before = self._last_death + delay
            logger.warning(
                "job worker (pid %d) exited with code %s; restarting in %.0fs", proc.pid, proc.returncode, delay
            )
