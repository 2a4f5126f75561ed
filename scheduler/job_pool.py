"""The job worker pool: ``job_workers`` RQ worker processes that the leading scheduler keeps running.

Unlike replicas, job workers are plain children in the scheduler's own process
group, because they hold no state worth outliving the scheduler for: whatever
stops the scheduler's group (``streamserve up`` on Ctrl-C, or its SIGKILL)
stops them too, and the kernel sends them SIGTERM if the scheduler dies
(``die_with_parent``); they hold `up`'s lifeline too, and leave within
FARM_GONE_DRAIN_S when it is cut (``up`` killed -9). A job whose worker was killed fails at once with
JobAbandoned (the call it made may or may not have run, so it is not run
again): the pool looks for such jobs whenever one of its workers ends, when
it starts, and every SWEEP_EVERY_S for workers of this host that died while
no scheduler watched them. Workers elsewhere are left to RQ's own
maintenance. The sweep also queues again a job that a worker (of any host)
took and died before starting: it never ran (``JobQueue.requeue_stranded``).
The same sweep uncounts, from their deployments' ``max_queued_jobs``, the jobs
that ended without saying so (``JobQueue.prune_counts``).

SIGTERM is RQ's warm shutdown: finish the current job, then exit. A job worker
takes a SIGTERM after the first as the same request (``JobWorker``), so the
group-wide signal and our own, however far apart, do not add up to RQ's cold
shutdown, which would fail the job; the end of the drain is SIGKILL (``kill``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time

import redis

from streamserve.client.jobs import STRANDED_AFTER_S, JobQueue, jobs_redis_url, local_worker_gone
from streamserve.runtime.lifeline import inherited
from streamserve.runtime.processes import die_with_parent, role_command
from streamserve.runtime.settings import Settings
from streamserve.transport.backoff import Backoff
from streamserve.transport.cluster_nodes import nodes_env
from streamserve.transport.connections import WriteRefusals, sync_redis

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 1.0
# A worker that keeps dying (Redis gone, a broken install) is restarted at most this rarely.
MAX_BACKOFF_S = 30.0
# A pool with no death for this long starts restarting without delay again.
CALM_AFTER_S = 60.0
# How often the pool looks for started jobs whose worker on this host is gone, besides when one of its own ends.
SWEEP_EVERY_S = 30.0


class JobWorkerPool:
    """Starts, restarts and stops ``settings.job_workers`` processes of ``streamserve job-worker``."""

    def __init__(self, settings: Settings) -> None:
        self.size = settings.job_workers
        self._env = settings.user_code_env(os.environ)  # job workers need no gateway secret
        self._procs: list[subprocess.Popen[bytes]] = []
        self._signalled: set[int] = set()
        self._backoff = Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
        self._not_before = 0.0
        self._last_death = 0.0
        self._settings = settings
        self._jobs: JobQueue | None = None
        self._sweep_at = 0.0  # at once, on the first tick
        self._refusals = WriteRefusals(logger, "job workers' sweep")
        lifeline = inherited(settings.lifeline_fd)  # `up`'s, handed on as the launcher does to replicas
        self._pass_fds = () if lifeline is None else (lifeline,)

    @property
    def pids(self) -> list[int]:
        """The workers that run now (stopping ones included)."""
        return [p.pid for p in self._procs if p.poll() is None]

    async def keep_running(self) -> None:
        """Reap the workers that exited, fail what they left started, start what is missing (each leading tick)."""
        if self._reap():
            self._sweep_at = 0.0
        now = time.monotonic()
        if now >= self._sweep_at:
            await asyncio.to_thread(self._fail_abandoned)
        if now - self._last_death > CALM_AFTER_S:
            self._backoff.reset()
        if now < self._not_before:
            return
        while len(self._procs) - len(self._signalled) < self.size:
            cmd = role_command("job-worker")
            env = {**self._env, **nodes_env(self._settings.effective_redis_url)}  # (as scheduler/launcher.py)
            proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent, pass_fds=self._pass_fds
            )
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

    def stop_taking_jobs(self) -> None:
        """The farm is stopping: each worker finishes the job it runs and exits, and none is started again, so the
        jobs still queued wait for the next farm (its gateway may drain for seconds before this scheduler stops)."""
        if self.size:
            logger.info("job workers: the farm is stopping; the jobs still queued wait for its next start")
        self.size = 0
        self.stop()

    async def kill(self) -> None:
        """End every worker still running at once; fail the jobs they were running."""
        for proc in self._procs:
            if proc.poll() is None:
                logger.warning("job worker (pid %d) did not stop in time: killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if self._reap():
            await asyncio.to_thread(self._fail_abandoned)

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.connection.close()
            self._jobs = None

    def _fail_abandoned(self) -> None:
        """Fail the started jobs of workers of this host that are gone (on a thread: RQ blocks)."""
        if self._jobs is None:
            connection = sync_redis(jobs_redis_url(self._settings))
            self._jobs = JobQueue(connection, self._settings.keys, self._settings.job_result_ttl_s)
        try:
            failed = self._jobs.fail_abandoned(local_worker_gone)
            requeued, unsettled = self._jobs.requeue_stranded()
            self._jobs.prune_counts()
        except redis.RedisError as exc:
            if not self._refusals.refused(exc):  # a full Redis: said once, not on every tick until it has room
                logger.warning("could not look for jobs left by stopped job workers: %s; will retry", exc)
            self._sweep_at = 0.0
            return
        if failed:
            self._refusals.accepted()
        self._sweep_at = time.monotonic() + (STRANDED_AFTER_S if unsettled else SWEEP_EVERY_S)
        for job_id in failed:
            logger.warning("job %s failed: its job worker stopped while running it", job_id)
        for job_id in requeued:
            logger.warning("job %s queued again: a job worker stopped after taking it, before starting it", job_id)

    def _reap(self) -> bool:
        """Forget the workers that exited; whether any had."""
        exited = [p for p in self._procs if p.poll() is not None]
        for proc in exited:
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
        return bool(exited)
