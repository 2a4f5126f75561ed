"""Starting the server side of each system compared, as Children of one bench.

Every starter returns once the system can take work (or its worker is at least started: the driver's
first call, with a long timeout, then waits for it) and the Redis URL its callers use.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from bench.children import Child, Children, start_redis
from bench.farm import start_farm

# How many requests the noop server side runs at once: the replica's max_ongoing_requests, Celery's
# thread pool, arq's max_jobs, the raw worker's read batch. (An RQ worker runs one job at a time.)
NOOP_CONCURRENCY = 32

NOOP_CONFIG = f"""\
deployments:
  - name: noop
    import_path: examples.functions:noop
    num_replicas: 1
    max_ongoing_requests: {NOOP_CONCURRENCY}
    max_queued_requests: 5000
    route_prefix: /noop
"""


def py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def streamserve_noop(children: Children) -> str:
    return start_farm(children, NOOP_CONFIG).effective_redis_url


def raw_streams(children: Children) -> str:
    url = start_redis(children)
    worker = children.start(
        Child("raw-worker", py("bench.compare.raw_streams", "--redis-url", url, "--batch", str(NOOP_CONCURRENCY)))
    )
    worker.wait_for_line("ready", 30)
    return url


def celery_worker(children: Children) -> str:
    url = start_redis(children)
    argv = py("bench.compare.celery_app", "worker", "--redis-url", url, "--concurrency", str(NOOP_CONCURRENCY))
    children.start(Child("celery-worker", argv))
    return url


def rq_worker(children: Children) -> str:
    url = start_redis(children)
    children.start(Child("rq-worker", py("bench.compare.rq_jobs", "--redis-url", url)))
    return url


def arq_worker(children: Children) -> str:
    url = start_redis(children)
    argv = py("bench.compare.arq_jobs", "--redis-url", url, "--max-jobs", str(NOOP_CONCURRENCY))
    children.start(Child("arq-worker", argv))
    return url


# Client-path target (bench/driver.py) -> what serves it.
CLIENT_SERVERS: dict[str, Callable[[Children], str]] = {
    "streamserve": streamserve_noop,
    "raw": raw_streams,
    "raw-pipelined": raw_streams,
    "celery": celery_worker,
    "rq": rq_worker,
    "arq": arq_worker,
}

# Target -> the module it needs (targets whose package is missing are skipped with a note).
NEEDS = {"celery": "celery", "rq": "rq", "arq": "arq"}
