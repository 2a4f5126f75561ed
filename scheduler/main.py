"""Entry point of the scheduler process: ``python -m streamserve scheduler``."""

from __future__ import annotations

import argparse
import asyncio
import logging

import redis.asyncio as aioredis

from streamserve.client.jobs import jobs_redis_url
from streamserve.runtime.logging_setup import start_process
from streamserve.runtime.settings import Settings
from streamserve.scheduler.collector import collect_periodically
from streamserve.scheduler.job_pool import JobWorkerPool
from streamserve.scheduler.launcher import ProcessLauncher
from streamserve.scheduler.scheduler import Scheduler
from streamserve.scheduler.stop_signals import JobsStopSignal, StopSignals
from streamserve.transport.connections import RETRYABLE_ERRORS, RedisRefusals, async_redis, ping, retry_cannot_mend

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve scheduler", description="Run the scheduler (controller).")
    parser.add_argument(
        "--stop-replicas-on-exit",
        action="store_true",
        help="stop every replica when this scheduler exits (what `streamserve up` does); "
        "by default replicas keep serving and the next scheduler adopts them",
    )
    return parser


async def run(settings: Settings, stop_replicas_on_exit: bool, jobs_stop: JobsStopSignal) -> int:
    """Run the scheduler; 1 at once when no retry mends the failure to reach Redis (retry_cannot_mend: a refused
    password, say); a Redis that is down, it waits for."""
    url = settings.effective_redis_url
    redis = async_redis(url)
    try:
        await ping(redis)
    except RETRYABLE_ERRORS as exc:
        if retry_cannot_mend(url, exc):
            # Not a Redis still on its way up, which the scheduler waits for (started before it, say).
            logger.error("scheduler: %s", RedisRefusals(url).meaning(exc))
            await redis.aclose()
            return 1
    scheduler = Scheduler(
        settings,
        redis,
        ProcessLauncher(settings),
        stop_replicas_on_exit=stop_replicas_on_exit,
        job_pool=JobWorkerPool(settings) if settings.job_workers else None,
    )
    jobs_stop.attach(scheduler.stop_taking_jobs)
    await serve(scheduler, redis)
    return 0


async def serve(scheduler: Scheduler, redis: aioredis.Redis) -> None:
    """Run ``scheduler`` as the process's one job until SIGTERM or SIGINT, then close ``redis``.

    The signal is answered within a second, whatever a tick is doing (scheduler/stop_signals.py).
    """
    collector = asyncio.create_task(collect_periodically())
    try:
        with StopSignals(scheduler.should_exit.set):
            await scheduler.run()
    finally:
        collector.cancel()
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    jobs_stop = JobsStopSignal()
    args, settings = start_process(build_parser(), argv)
    if settings.job_workers:
        jobs_redis_url(settings)  # refused now (ConfigError, exit 2) rather than by every job worker it would start
    return asyncio.run(run(settings, args.stop_replicas_on_exit, jobs_stop))
