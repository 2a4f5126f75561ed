"""One measured client-path phase in a fresh process: probe, warm up, measure, print the result as JSON.

    python -m bench.driver TARGET --redis-url URL --concurrency N --warmup S --duration S [--deployment NAME]

Each (target, concurrency, repetition) gets its own process, so no client's threads, connections or
caches carry over into another's measurement. Async clients run on uvloop (as the gateway does);
blocking clients (Celery, RQ) run one thread per outstanding request.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import uvloop

from bench.children import child_env
from bench.loadgen import NOOP_BODY, async_phase, thread_phase
from bench.options import Options
from bench.stats import Sample
from tests.harness.paths import ROOT

PROBE_TIMEOUT_S = 60.0  # the first call may wait for a worker that is still starting


@dataclass
class AsyncTarget:
    call: Callable[[], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]


@dataclass
class ThreadTarget:
    call: Callable[[], Any]
    close: Callable[[], None]


Opener = Callable[[argparse.Namespace], Awaitable[AsyncTarget | ThreadTarget]]


async def open_streamserve(args: argparse.Namespace) -> AsyncTarget:
    from streamserve import AsyncClient

    client = AsyncClient(args.redis_url)
    await client.start()
    body, name = args.body, args.deployment
    return AsyncTarget(lambda: client.call(name, body, timeout=30), client.aclose)


async def open_streamserve_keyed(args: argparse.Namespace) -> AsyncTarget:
    """``open_streamserve`` with a fresh idempotency key on every call (each runs: what a key costs)."""
    import itertools
    import secrets

    from streamserve import AsyncClient

    client = AsyncClient(args.redis_url)
    await client.start()
    body, name = args.body, args.deployment
    prefix, numbers = secrets.token_hex(4), itertools.count()
    return AsyncTarget(
        lambda: client.call(name, body, timeout=30, idempotency_key=f"{prefix}-{next(numbers)}"), client.aclose
    )


async def _open_raw(args: argparse.Namespace, pipelined: bool) -> AsyncTarget:
    from bench.compare.raw_streams import RawClient

    client = RawClient(args.redis_url, pipelined)
    await client.start()
    body = args.body
    return AsyncTarget(lambda: client.call(body), client.aclose)


async def open_raw(args: argparse.Namespace) -> AsyncTarget:
    return await _open_raw(args, pipelined=False)


async def open_raw_pipelined(args: argparse.Namespace) -> AsyncTarget:
    return await _open_raw(args, pipelined=True)


async def open_arq(args: argparse.Namespace) -> AsyncTarget:
    from arq import create_pool

    from bench.compare.arq_jobs import DEFAULT_RESULT_POLL_S, RESULT_POLL_S, redis_settings

    # arq's pool raises past max_connections (redis-py's default: 100): room for every outstanding call.
    settings = dataclasses.replace(redis_settings(args.redis_url), max_connections=args.concurrency + 16)
    pool = await create_pool(settings)
    poll = RESULT_POLL_S.get(args.concurrency, DEFAULT_RESULT_POLL_S)
    body = args.body

    async def call() -> Any:
        job = await pool.enqueue_job("noop", body)
        assert job is not None
        return await job.result(timeout=30, poll_delay=poll)

    return AsyncTarget(call, pool.aclose)


async def open_celery(args: argparse.Namespace) -> ThreadTarget:
    from bench.compare.celery_app import NOOP_TASK, make_app

    app = make_app(args.redis_url)
    task = app.tasks[NOOP_TASK]
    body = args.body
    return ThreadTarget(lambda: task.delay(body).get(timeout=30), app.close)


async def open_rq(args: argparse.Namespace) -> ThreadTarget:
    from redis import BlockingConnectionPool, Redis
    from rq import Queue

    from bench.compare.rq_jobs import QUEUE, noop

    # Each waiting caller holds a connection in its blocking XREAD: one per outstanding call.
    pool = BlockingConnectionPool.from_url(args.redis_url, max_connections=args.concurrency + 16, timeout=20)
    connection = Redis(connection_pool=pool)
    queue = Queue(QUEUE, connection=connection)
    body = args.body

    def call() -> Any:
        job = queue.enqueue(noop, body, result_ttl=600)
        result = job.latest_result(timeout=30)
        if result is None:
            raise TimeoutError("no RQ result within 30 s")
        return result.return_value

    return ThreadTarget(call, connection.close)


TARGETS: dict[str, Opener] = {
    "streamserve": open_streamserve,
    "streamserve-keyed": open_streamserve_keyed,
    "raw": open_raw,
    "raw-pipelined": open_raw_pipelined,
    "celery": open_celery,
    "rq": open_rq,
    "arq": open_arq,
}


async def _drive(args: argparse.Namespace) -> Sample:
    target = await TARGETS[args.target](args)
    try:
        if isinstance(target, AsyncTarget):
            import asyncio

            answer = await asyncio.wait_for(target.call(), PROBE_TIMEOUT_S)
            check(answer, args.body)
            await async_phase(target.call, args.concurrency, args.warmup, args.max_requests)
            return await async_phase(target.call, args.concurrency, args.duration, args.max_requests)
        check(target.call(), args.body)
        thread_phase(target.call, args.concurrency, args.warmup, args.max_requests)
        return thread_phase(target.call, args.concurrency, args.duration, args.max_requests)
    finally:
        if isinstance(target, AsyncTarget):
            await target.close()
        else:
            target.close()


def check(answer: Any, body: Any) -> None:
    if args_expect_echo(body) and answer != body:
        raise RuntimeError(f"the probe call answered {answer!r}, expected {body!r}")


def args_expect_echo(body: Any) -> bool:
    """Noop targets answer their input; the scaling bench's sleepy deployment answers something else."""
    return not (isinstance(body, dict) and "seconds" in body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--deployment", default="noop", help="streamserve deployment to call")
    parser.add_argument("--body", type=orjson.loads, default=NOOP_BODY, help="JSON body of every call")
    args = parser.parse_args(argv)
    sample = uvloop.run(_drive(args))
    print(json.dumps(sample.to_json()), flush=True)
    return 0


def run_driver(
    target: str, redis_url: str, concurrency: int, opts: Options, *extra: str, duration_s: float | None = None
) -> dict[str, Any]:
    """Run one driver process and return its sample (raises with its output if it fails)."""
    duration = opts.duration_s if duration_s is None else duration_s
    cmd = [sys.executable, "-m", "bench.driver", target, "--redis-url", redis_url, "--concurrency", str(concurrency)]
    cmd += ["--warmup", str(opts.warmup_s), "--duration", str(duration), "--max-requests", str(opts.max_requests)]
    cmd += list(extra)
    timeout = PROBE_TIMEOUT_S + opts.warmup_s + duration + 60
    out = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"driver {target} c={concurrency} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    raise SystemExit(main())
