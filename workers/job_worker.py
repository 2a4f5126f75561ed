"""Entry point of a job worker: ``streamserve job-worker``, one RQ worker on the asynchronous-jobs queue.

It runs jobs in its own process, one at a time (RQ's SimpleWorker, no fork per
job), so every job of the process shares one streamserve Client: one reply
stream, one reader, the deployments already loaded. The scheduler keeps
``job_workers`` of these running; more can run anywhere that reaches Redis.
"""

from __future__ import annotations

import argparse
import logging
import os

from rq.worker import SimpleWorker

from streamserve.client.jobs import JOB_SERIALIZER, JobQueue, job_worker_name, jobs_redis_url
from streamserve.runtime.logging_setup import start_process
from streamserve.transport.connections import sync_redis
from streamserve.workers import job_function

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamserve job-worker", description="Run one RQ worker for asynchronous jobs."
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    _args, settings = start_process(build_parser(), argv)
    connection = sync_redis(jobs_redis_url(settings))
    queue = JobQueue(connection, settings.keys, settings.job_result_ttl_s).queue
    job_function.configure(settings)
    worker = SimpleWorker(
        [queue],
        connection=connection,
        serializer=JOB_SERIALIZER,
        name=job_worker_name(os.getpid()),
    )
    logger.info("job worker %s: serving queue %s", worker.name, queue.name)
    try:
        # RQ logs every job at INFO; the farm's terminal gets its warnings only, unless debugging.
        worker.work(logging_level="DEBUG" if settings.debug else "WARNING")
    finally:
        job_function.close()
        connection.close()
        logger.info("job worker %s: exited", worker.name)
    return 0
