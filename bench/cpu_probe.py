"""CPU time per request of each process on the path: the steadier signal when tuning the hot path.

req/s on a 2-core machine moves with whatever else runs; the CPU each process
spends per request barely does, so it is the figure to compare before and
after a change (run the two versions alternately). Starts its own embedded
Redis, one replica and, with ``--http``, one gateway process; sends N requests
after a warm-up; prints one line; stops what it started.

- client path (default): ``AsyncClient`` with 256 calls outstanding to a noop
  function replica (``examples.functions:noop``, max_ongoing_requests 64).
- ``--batch``: the client path to ``examples.batched:scale`` (batches of up to 16).
- ``--http``: ``POST /echo`` on 32 keep-alive connections to a gateway, one
  ``examples.echo:Echo`` replica (max_ongoing_requests 32); also the p50/p99
  of 2,000 sequential requests.
- ``--bare``: the same load on ``bench.bare_app`` (FastAPI, the noop in its
  endpoint, no queue, the gateway's uvicorn settings): the ceiling's CPU per
  request, beside which the gateway's is compared (issue 32: one gateway process
  against one uvicorn worker).
- ``--keyed``: the client path, each call with an idempotency key of its own; with ``--http``, the HTTP path,
  each request with an ``Idempotency-Key`` of its own.
- ``--async-handler``: the client path to ``bench.deployments:async_noop``, the
  noop as an async handler (no hop to a handler thread).
- ``--raw``: the client path's load (256 outstanding) on ``bench.compare.raw_streams``
  with the caller's XADDs pipelined: the client path's ceiling, process by
  process (the raw worker beside the replica, the raw caller beside AsyncClient).

    .venv/bin/python -m bench.cpu_probe [N] [--http | --batch | --bare | --raw | --async-handler] [--keyed]

Each line also gives the Redis commands per request (INFO commandstats).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import uvloop

from bench.compare.raw_streams import RawClient
from bench.loadgen import Connection, http_probe, keyed_requests, post_request
from bench.stats import percentile
from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import die_with_parent, free_port, role_command, stop_group
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import parse_config
from streamserve.wire.errors import StreamServeError
from tests.harness.paths import ROOT
from tests.harness.waiting import wait_for_async

WARMUP = 2000
READY_TIMEOUT_S = 20.0  # for the replica to import and report ready (and the gateway to route to it), tried every 50 ms
CLIENT = {"name": "noop", "import_path": "examples.functions:noop", "max_ongoing_requests": 64}
HTTP = {"name": "echo", "import_path": "examples.echo:Echo", "max_ongoing_requests": 32, "route_prefix": "/echo"}
BATCH = {"name": "scale", "import_path": "examples.batched:scale", "max_ongoing_requests": 64}
ASYNC = {"name": "async-noop", "import_path": "bench.deployments:async_noop", "max_ongoing_requests": 64}
PATHS: dict[str, dict[str, Any]] = {
    "client": CLIENT,
    "http": HTTP,
    "http-keyed": HTTP,
    "batch": BATCH,
    "async": ASYNC,
    "keyed": CLIENT,
}
BODY = b'{"x":[1,2,3]}'


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Measured:
    """One probe's figures, per request: CPU of each process, and the Redis commands by name."""

    req_s: float
    cpu_us: dict[str, float]
    commands: dict[str, float]

    def line(self) -> str:
        per_request = "   ".join(f"{name} {us:5.1f}" for name, us in self.cpu_us.items())
        total = f"total {sum(self.cpu_us.values()):5.1f}"
        commands = f"Redis commands/req {sum(self.commands.values()):.2f}"
        return f"{self.req_s:7.0f} req/s   CPU us/req: {per_request}   {total}   {commands}"


def command_calls(redis_url: str) -> dict[str, int]:
    """Calls so far of every command, from INFO commandstats (``cmdstat_xadd`` -> ``xadd``)."""
    with redis.Redis.from_url(redis_url) as client:
        stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(fields["calls"]) for name, fields in stats.items()}


async def measure(
    pids: dict[str, int], n: int, send: Callable[[int], Awaitable[object]], redis_url: str | None
) -> Measured:
    """Warm up, then send n requests; req/s, CPU us per request of each process and of this one, Redis commands
    (none without ``redis_url``)."""
    await send(WARMUP)
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    calls_before = command_calls(redis_url) if redis_url else {}
    own, wall = own_cpu_seconds(), time.perf_counter()
    await send(n)
    wall = time.perf_counter() - wall
    used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    used["load generator"] = own_cpu_seconds() - own
    calls: dict[str, int] = {}
    if redis_url:
        calls = {name: count - calls_before.get(name, 0) for name, count in command_calls(redis_url).items()}
        calls["info"] = calls.get("info", 0) - 1  # our own INFO commandstats
    return Measured(
        req_s=n / wall,
        cpu_us={name: seconds / n * 1e6 for name, seconds in used.items()},
        commands={name: count / n for name, count in sorted(calls.items()) if count > 0},
    )


async def client_path(
    settings: Settings, pids: dict[str, int], n: int, deployment: dict[str, Any], keyed: bool = False
) -> Measured:
    """``keyed``: each call with an idempotency key of its own (what a key costs a call that runs)."""
    name = str(deployment["name"])
    keys = itertools.count()
    prefix = f"probe-{os.getpid()}-{time.time_ns()}-"
    async with AsyncClient(settings=settings) as client:

        async def answers() -> bool:
            try:
                await client.call(name, {"x": 1}, timeout=1)
            except StreamServeError:
                return False
            return True

        await wait_for_async(answers, READY_TIMEOUT_S, f"{name} never answered", interval_s=0.05)
        gate = asyncio.Semaphore(256)

        async def one(i: int) -> object:
            async with gate:
                if keyed:
                    return await client.call(name, {"x": i}, idempotency_key=f"{prefix}{next(keys)}")
                return await client.call(name, {"x": i})

        async def send(count: int) -> None:
            await asyncio.gather(*(one(i) for i in range(count)))

        return await measure(pids, n, send, settings.effective_redis_url)


async def http_path(
    port: int, pids: dict[str, int], n: int, redis_url: str | None, path: str = "/echo", keyed: bool = False
) -> tuple[Measured, str]:
    """``keyed``: each request with an ``Idempotency-Key`` of its own."""

    async def answers() -> bool:
        try:
            return (await http_probe(port, path, BODY))[0] == 200
        except OSError:
            return False

    await wait_for_async(answers, READY_TIMEOUT_S, f"the server never answered {path}", interval_s=0.05)
    plain = post_request(port, path, BODY)
    next_request = keyed_requests(port, path, BODY) if keyed else lambda: plain
    latencies: list[float] = []

    async def send_on(conns: list[Connection], count: int) -> None:
        left = count

        async def worker(conn: Connection) -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                status, answer, _ = await conn.send(next_request())
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {answer!r}")
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker(conn) for conn in conns))

    conns = [await Connection.open(port) for _ in range(32)]
    try:
        measured = await measure(pids, n, lambda count: send_on(conns, count), redis_url)
        latencies.clear()
        await send_on(conns[:1], 2000)
    finally:
        for conn in conns:
            conn.close()
    ordered = sorted(latencies)
    p50, p99 = percentile(ordered, 0.5) * 1e3, percentile(ordered, 0.99) * 1e3
    return measured, f"HTTP c=1: p50 {p50:.3f} ms   p99 {p99:.3f} ms"


def _child_options(env: dict[str, str]) -> dict[str, Any]:
    """Own process group (stopped as one), and a SIGTERM from the kernel if this probe dies first."""
    return {"env": env, "cwd": ROOT, "start_new_session": True, "preexec_fn": die_with_parent}


async def bare(n: int) -> tuple[Measured, str]:
    """The HTTP load on bench.bare_app: the ceiling's figures and summary."""
    port = free_port()
    command = [sys.executable, "-m", "bench.bare_app", "--port", str(port)]
    server = subprocess.Popen(command, **_child_options({**os.environ}))
    try:
        measured, latency = await http_path(port, {"bare FastAPI": server.pid}, n, None, "/noop")
        return measured, f"bare FastAPI c=32: {measured.line()}\n{latency}"
    finally:
        stop_group(server, 15)


async def raw(n: int) -> tuple[Measured, str]:
    """The client path's load on raw Redis streams, the caller's XADDs pipelined: the ceiling's figures."""
    with EmbeddedRedis(port=free_port()) as server:
        command = [sys.executable, "-m", "bench.compare.raw_streams", "--redis-url", server.url]
        worker = subprocess.Popen(command, stdout=subprocess.PIPE, **_child_options({**os.environ}))
        client = RawClient(server.url, pipelined=True)
        try:
            assert worker.stdout is not None and server.proc is not None
            await asyncio.to_thread(worker.stdout.readline)  # "raw streams worker ready"
            await client.start()
            gate = asyncio.Semaphore(256)

            async def one(i: int) -> object:
                async with gate:
                    return await client.call({"x": i})

            async def send(count: int) -> None:
                await asyncio.gather(*(one(i) for i in range(count)))

            pids = {"raw worker": worker.pid, "redis": server.proc.pid}
            measured = await measure(pids, n, send, server.url)
            return measured, f"raw streams, pipelined, 256 outstanding: {measured.line()}"
        finally:
            await client.aclose()
            stop_group(worker, 15)


async def probe(n: int, path: str) -> tuple[Measured, str]:
    """Run one path (``client``, ``batch``, ``http``, ``bare`` or ``raw``); its figures and a one-line summary."""
    if path == "bare":
        return await bare(n)
    if path == "raw":
        return await raw(n)
    deployment = PATHS[path]
    with EmbeddedRedis(port=free_port()) as server:
        settings = Settings(redis_url=server.url)
        redis = async_redis(server.url)
        await DesiredState(redis, settings.keys).apply(parse_config({"deployments": [deployment]}))
        await redis.aclose()
        env = {**os.environ, **settings.to_env()}
        started: list[subprocess.Popen[bytes]] = []
        try:
            replica = subprocess.Popen(role_command("worker", str(deployment["name"])), **_child_options(env))
            started.append(replica)
            assert server.proc is not None
            pids = {"replica": replica.pid, "redis": server.proc.pid}
            if path not in ("http", "http-keyed"):
                measured = await client_path(settings, pids, n, deployment, keyed=path == "keyed")
                return measured, f"{path} path, 256 outstanding: {measured.line()}"
            port = free_port()
            gateway = subprocess.Popen(role_command("gateway", "--port", str(port)), **_child_options(env))
            started.append(gateway)
            all_pids = {"gateway": gateway.pid, **pids}
            measured, latency = await http_path(port, all_pids, n, server.url, keyed=path == "http-keyed")
            return measured, f"{'keyed ' if path == 'http-keyed' else ''}HTTP c=32: {measured.line()}\n{latency}"
        finally:
            for proc in reversed(started):
                stop_group(proc, 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("n", nargs="?", type=int, default=20_000, help="measured requests (default 20000)")
    parser.add_argument("--http", action="store_true", help="through a gateway over HTTP, not the Python client")
    parser.add_argument("--batch", action="store_true", help="the client path to a batched deployment")
    parser.add_argument("--bare", action="store_true", help="the HTTP load on bare FastAPI (the ceiling)")
    parser.add_argument("--raw", action="store_true", help="the client load on raw pipelined streams (the ceiling)")
    parser.add_argument("--async-handler", action="store_true", help="the client path to an async noop handler")
    parser.add_argument("--keyed", action="store_true", help="the client path, each call with an idempotency key")
    args = parser.parse_args()
    flags = {
        "http": args.http,
        "batch": args.batch,
        "bare": args.bare,
        "raw": args.raw,
        "async": args.async_handler,
        "keyed": args.keyed,
    }
    path = next((name for name, given in flags.items() if given), "client")
    if args.http and args.keyed:
        path = "http-keyed"
    print(uvloop.run(probe(args.n, path))[1], f"  (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
