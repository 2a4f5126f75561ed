"""Entry point of a job worker: ``streamserve job-worker``, one RQ worker on the asynchronous-jobs queue.

It runs jobs in its own process, one at a time (RQ's SimpleWorker, no fork per
job), so every job of the process shares one streamserve Client: one reply
stream, one reader, the deployments already loaded. The scheduler keeps
``job_workers`` of these running; more can run anywhere that reaches Redis.

A Redis out of memory refuses RQ's writes (the worker's registration, taking a
job, recording a result). RQ would give up and exit, to be started again and
exit again; instead every command of the worker waits while Redis refuses it
for memory, said once in the log, and goes on when Redis has room: no job is
taken meanwhile, and a result is kept until it can be recorded.

A job worker of ``streamserve up`` holds its lifeline (runtime/lifeline.py). When ``up`` dies (kill -9), nobody
will stop the worker, and the embedded Redis is gone with ``up``: the worker stops taking jobs, gives the job it
runs FARM_GONE_DRAIN_S (and its last writes FARM_GONE_WIND_DOWN_S), and ends then if RQ has not.
The job it ran is failed as abandoned by the next farm's job pool, like that of any killed worker.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq.exceptions import DequeueTimeout
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.queue import Queue
from rq.worker import SimpleWorker, WorkerStatus

from streamserve.client.job_guard import GuardedJob
from streamserve.client.jobs import JOB_SERIALIZER, JobQueue, job_worker_name, jobs_redis_url
from streamserve.runtime.lifeline import FARM_GONE_DRAIN_S, FARM_GONE_WIND_DOWN_S, inherited, watch_from_thread
from streamserve.runtime.logging_setup import start_process
from streamserve.runtime.processes import role_command
from streamserve.runtime.settings import Settings, forget_gateway_secrets
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RedisRefusals, WriteRefusals, redacted, stop_retrying, sync_redis
from streamserve.wire.errors import RequestCancelledError, StreamServeError
from streamserve.workers import job_function

logger = logging.getLogger(__name__)

T = TypeVar("T")

# An idle job worker waits for a job this long at a time: a stop asked meanwhile is taken between two waits.
IDLE_WAIT_S = 1

# A command Redis refused for memory is sent again after these delays, doubling.
FULL_RETRY_FIRST_S = 0.1
FULL_RETRY_CAP_S = 2.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamserve job-worker", description="Run one RQ worker for asynchronous jobs."
    )
    return parser


# When the worker was asked to stop (time.monotonic()), None before: from then on a write Redis refuses is waited for
# REFUSED_AFTER_STOP_S at most (a job's result through a moment's want of memory; not through a full disk for ever).
_stopped_at: float | None = None
REFUSED_AFTER_STOP_S = 5.0


def _stop_asked() -> None:
    global _stopped_at
    if _stopped_at is None:
        _stopped_at = time.monotonic()


class WaitWhileFull(Retry):
    """The connection's retry policy, and besides: a command Redis refuses (for memory, or a full disk) is sent again
    until taken; once the worker is asked to stop, for REFUSED_AFTER_STOP_S at most.

    A refused command did not run (a transaction that held one was discarded whole), so sending it again is safe.
    """

    def __init__(self, policy: Retry, refusals: WriteRefusals) -> None:
        super().__init__(NoBackoff(), 0)
        self._policy = policy
        self._refusals = refusals  # shared by the copies each connection makes

    def __deepcopy__(self, memo: dict[int, Any]) -> WaitWhileFull:
        return WaitWhileFull(copy.deepcopy(self._policy, memo), self._refusals)

    def update_supported_errors(self, specified_errors: Iterable[type[Exception]]) -> None:
        self._policy.update_supported_errors(specified_errors)

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any], *args: Any, **kwargs: Any) -> T:
        backoff = Backoff(FULL_RETRY_FIRST_S, FULL_RETRY_CAP_S)
        while True:
            try:
                result = self._policy.call_with_retry(do, fail, *args, **kwargs)
            except redis.ResponseError as exc:
                stopped_at = _stopped_at
                if not self._refusals.refused(exc) or (
                    stopped_at is not None and time.monotonic() - stopped_at > REFUSED_AFTER_STOP_S
                ):
                    raise
                time.sleep(backoff.next())
                continue
            if backoff.failures:  # this command was refused for memory, and has gone through now
                self._refusals.accepted()
            return result


class JobWorker(SimpleWorker):
    """RQ's SimpleWorker, which runs only streamserve's job function, and whose warm shutdown stays warm however many
    SIGTERMs follow the first.

    Every job it takes is a GuardedJob: one that names any other function (or callbacks, or webhooks), written to
    Redis by anyone who can, fails without running, and the worker goes on.

    RQ makes a second SIGTERM that comes more than a second after the first a cold shutdown, which fails the job it
    runs. Under ``up`` a job worker gets two, as far apart as the scheduler takes to finish its tick: one from ``up``
    to the scheduler's process group, one from the job pool. Whoever must stop a job worker at once uses SIGKILL (the
    pool does, at the end of the drain); a second Ctrl-C at a terminal is still RQ's cold shutdown.
    """

    job_class = GuardedJob

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """A job cancelled on purpose (``DELETE /-/jobs/<id>``) ends as RequestCancelledError: one INFO line for it,
        not RQ's ERROR with the job function's traceback. A job whose call failed (a StreamServeError: the handler's
        error, its deadline...) gets one ERROR line: its status says the rest, and the replica logged the handler's
        traceback. RQ logged the job function's own traceback as one line of several KB, its line breaks escaped."""
        error = exc_info[1]
        if isinstance(error, RequestCancelledError):
            logger.info("job worker %s: job %s cancelled", self.name, job.id)
            return
        if isinstance(error, StreamServeError):
            logger.error("job worker %s: job %s failed: %s: %s", self.name, job.id, type(error).__name__, error)
        else:  # the job function's own failure: its traceback, line by line
            logger.error("job worker %s: job %s failed", self.name, job.id, exc_info=exc_info)
        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def _shutdown(self) -> None:
        """A stop asked while no job runs is taken at the end of the worker's current wait for a job.

        RQ raises StopRequested from the signal handler then, wherever the worker is: after Redis moved a job to it
        (BLMOVE, to RQ's intermediate list) and before it ran it, the job was lost, 'queued' and in no queue, until
        RQ's own cleanup failed it minutes later. The job taken in that moment is run now, then the worker stops.
        """
        _stop_asked()
        if self.get_state() == WorkerStatus.BUSY:
            super()._shutdown()  # type: ignore[no-untyped-call]
            return
        self._stop_requested = True

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """The next job, waiting IDLE_WAIT_S at a time until one comes or a stop is asked (then None: the worker ends);
        with ``timeout`` None (RQ's burst mode), None at once when no job is queued.

        RQ's own loop, but for the stop: RQ's waits are long and end only by StopRequested, and so would its retries
        while Redis is away.
        """
        self.set_state(WorkerStatus.IDLE)
        unreachable = Backoff(FULL_RETRY_FIRST_S, IDLE_WAIT_S)
        while not self._stop_requested:
            try:
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()  # type: ignore[no-untyped-call]
                taken = self.queue_class.dequeue_any(
                    self._ordered_queues,
                    None if timeout is None else IDLE_WAIT_S,
                    connection=self.connection,
                    job_class=self.job_class,
                    serializer=self.serializer,
                    death_penalty_class=self.death_penalty_class,
                )
            except DequeueTimeout:
                unreachable.reset()  # Redis answered: the next time it is away is said again
                continue
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not unreachable.failures:
                    logger.error("job worker %s: cannot reach Redis: %s; retrying", self.name, exc)
                time.sleep(unreachable.next())
                continue
            if taken is None:
                if timeout is None:
                    return None
                continue
            job, queue = taken
            self.reorder_queues(reference_queue=queue)
            job.redis_server_version = self.get_redis_server_version()  # type: ignore[no-untyped-call]
            self.heartbeat()
            return taken
        return None

    def farm_gone(self, why: str) -> None:
        """Its `streamserve up` died (called on the lifeline's thread): stop taking jobs, and end the process once the
        job it runs has had FARM_GONE_DRAIN_S and its last writes FARM_GONE_WIND_DOWN_S, if RQ has not ended by then
        (its retries of a Redis gone with `up` would take far longer)."""
        logger.warning("job worker %s: %s; stopping", self.name, why)
        stop_retrying()
        _stop_asked()
        self._stop_requested = True  # what RQ's warm shutdown sets; its own would first write to Redis
        deadline = threading.Timer(FARM_GONE_DRAIN_S + FARM_GONE_WIND_DOWN_S, self._end_now)
        deadline.daemon = True
        deadline.start()

    def _end_now(self) -> None:
        job = self.get_current_job_id()
        logger.warning(
            "job worker %s: still running %gs after its farm went; exiting (job %s unfinished)",
            self.name,
            FARM_GONE_DRAIN_S + FARM_GONE_WIND_DOWN_S,
            job or "none",
        )
        sys.stderr.flush()
        os._exit(1)

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            if self.get_current_job_id() is not None:  # (idle, it is on its way out already: nothing to say)
                logger.info("job worker %s: SIGTERM again; still finishing its job first", self.name)
            return
        super().request_force_stop(signum, frame)


def leave_with_the_farm(worker: JobWorker, settings: Settings) -> None:
    """Under ``streamserve up``: stop the worker when `up` dies, told by the lifeline it handed down."""
    lifeline = inherited(settings.lifeline_fd)
    if lifeline is not None:
        pid = (settings.supervisor or "?").partition(":")[0]
        why = f"the `streamserve up` that started it (pid {pid}) is gone"
        watch_from_thread(lifeline, lambda: worker.farm_gone(why))


def main(argv: list[str] | None = None) -> int:
    _args, settings = start_process(build_parser(), argv)
    forget_gateway_secrets(
        role_command("job-worker", *(argv or []))
    )  # it needs none, and passes its environment on to nothing that should have them
    url = jobs_redis_url(settings)
    connection = sync_redis(url)
    policy = connection.get_retry()
    assert policy is not None  # sync_redis gives every connection the shared policy
    connection.set_retry(WaitWhileFull(policy, WriteRefusals(logger, f"job worker {os.getpid()}")))
    queue = JobQueue(connection, settings.keys, settings.job_result_ttl_s).queue
    job_function.configure(settings)
    try:  # (RQ's worker asks Redis as it is made)
        worker = JobWorker(
            [queue],
            connection=connection,
            serializer=JOB_SERIALIZER,
            name=job_worker_name(os.getpid()),
        )
    except redis.RedisError as exc:  # unreachable after the retry policy, or the password refused: one line
        said = RedisRefusals(url).meaning(exc) or f"Redis at {redacted(url)}: {exc}"
        logger.error("job worker %s: %s; exiting", os.getpid(), said)
        job_function.close()
        connection.close()
        return 1
    logger.info("job worker %s: serving queue %s", worker.name, queue.name)
    leave_with_the_farm(worker, settings)
    try:
        # RQ logs every job at INFO; the farm's terminal gets its warnings only, unless debugging.
        worker.work(logging_level="DEBUG" if settings.debug else "WARNING")
    except redis.ConnectionError as exc:  # Redis gone for good (RQ's own end, its register_death, needs it too)
        logger.error("job worker %s: Redis is unreachable: %s; exiting", worker.name, exc)
        return 1
    finally:
        job_function.close()
        connection.close()
        logger.info("job worker %s: exited", worker.name)
    return 0
