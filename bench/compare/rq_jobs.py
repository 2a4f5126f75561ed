"""RQ doing the noop: one SimpleWorker (runs jobs in its own process, no fork per job).

    python -m bench.compare.rq_jobs --redis-url URL

An RQ worker runs one job at a time by design; SimpleWorker skips the default fork per job, which is
RQ's fastest configuration for a job this small. Callers enqueue and block on ``job.latest_result``
(an XREAD on the job's result stream).
"""

from __future__ import annotations

import argparse
from typing import Any

QUEUE = "bench"


def noop(body: Any) -> Any:
    """Returns its input unchanged."""
    return body


def main(argv: list[str] | None = None) -> int:
    from redis import Redis
    from rq import Queue, SimpleWorker

    parser = argparse.ArgumentParser(description="RQ noop worker")
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args(argv)
    connection = Redis.from_url(args.redis_url)
    worker = SimpleWorker([Queue(QUEUE, connection=connection)], connection=connection)
    print("rq worker starting", flush=True)
    worker.work(logging_level="WARNING", with_scheduler=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
