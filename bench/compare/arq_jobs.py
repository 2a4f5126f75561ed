"""arq doing the noop: one worker process running up to ``--max-jobs`` jobs at once on asyncio.

    python -m bench.compare.arq_jobs --redis-url URL [--max-jobs 32]

arq has no result notification: the worker polls its queue and callers poll for results. Both poll
intervals are set far below arq's default of 0.5 s (which would cap a worker at max_jobs / 0.5 s jobs
per second and add up to 0.5 s to each call): WORKER_POLL_S here, and RESULT_POLL_S in the caller.
"""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

WORKER_POLL_S = 0.001
# Caller's result poll interval by concurrency; other concurrencies use DEFAULT_RESULT_POLL_S.
RESULT_POLL_S = {1: 0.001}
DEFAULT_RESULT_POLL_S = 0.01  # with 256 jobs outstanding, 10 ms already means 25,600 result GETs per second


async def noop(ctx: dict[str, Any], body: Any) -> Any:
    """Returns its input unchanged."""
    return body


def redis_settings(url: str) -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(url)


def main(argv: list[str] | None = None) -> int:
    from arq.worker import run_worker

    parser = argparse.ArgumentParser(description="arq noop worker")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--max-jobs", type=int, default=32)
    args = parser.parse_args(argv)

    class WorkerSettings:
        functions: ClassVar[list[Any]] = [noop]

    print("arq worker starting", flush=True)
    run_worker(
        WorkerSettings,  # type: ignore[arg-type]
        redis_settings=redis_settings(args.redis_url),
        max_jobs=args.max_jobs,
        poll_delay=WORKER_POLL_S,
        keep_result=600,
        handle_signals=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
