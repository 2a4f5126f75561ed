"""CPU time per request of the Python client and of one noop replica process.

A steadier signal than req/s on a busy machine: it counts the CPU each side
spends, not how long it waited for a core. Starts its own embedded Redis and
one replica (``examples.functions:noop``), sends N calls with 256 outstanding
after 2,000 warm-up calls, prints one line, and stops what it started.

    .venv/bin/python bench/cpu_probe.py [N]
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import uvloop

from streamserve.client import AsyncClient
from streamserve.config import parse_config
from streamserve.connection import async_redis
from streamserve.control import Control
from streamserve.embedded_redis import EmbeddedRedis
from streamserve.errors import StreamServeError
from streamserve.procs import free_port
from streamserve.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
OUTSTANDING = 256
WARMUP = 2000
CONFIG = {"deployments": [{"name": "noop", "import_path": "examples.functions:noop", "max_ongoing_requests": 64}]}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def probe(n: int) -> str:
    with EmbeddedRedis(port=free_port()) as server:
        settings = Settings(redis_url=server.url)
        redis = async_redis(server.url)
        await Control(redis, settings.keys).apply(parse_config(CONFIG))
        await redis.aclose()
        env = {**os.environ, **settings.to_env()}
        replica = subprocess.Popen([sys.executable, "-m", "workers", "noop"], env=env, cwd=ROOT)
        try:
            async with AsyncClient(settings=settings) as client:
                for _ in range(400):  # the replica imports and reports ready: at most 20 s
                    try:
                        await client.call("noop", 1, timeout=1)
                        break
                    except StreamServeError:
                        await asyncio.sleep(0.05)
                gate = asyncio.Semaphore(OUTSTANDING)

                async def one(i: int) -> object:
                    async with gate:
                        return await client.call("noop", {"i": i})

                await asyncio.gather(*(one(i) for i in range(WARMUP)))
                replica0, self0, wall0 = (
                    cpu_seconds(replica.pid),
                    resource.getrusage(resource.RUSAGE_SELF),
                    time.perf_counter(),
                )
                await asyncio.gather(*(one(i) for i in range(n)))
                wall = time.perf_counter() - wall0
                replica1, self1 = cpu_seconds(replica.pid), resource.getrusage(resource.RUSAGE_SELF)
        finally:
            replica.terminate()
            replica.wait(15)
    client_s = (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime)
    return (
        f"{n / wall:8.0f} req/s   client {client_s / n * 1e6:6.1f} us/req   "
        f"replica {(replica1 - replica0) / n * 1e6:6.1f} us/req   load {os.getloadavg()[0]:.1f}"
    )


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    print(uvloop.run(probe(n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
