"""A script that never closes its AsyncClient still ends: asyncio.run() cancels the client's tasks, and each of them
stops (redis-py can swallow a cancellation that lands in a pub/sub read, or, on Python 3.11, in the write of a
command: the config subscription and the reply reader must stop all the same)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from streamserve.runtime.settings import Settings
from tests.integration.conftest import StartReplica

SCRIPT = """
import asyncio, sys
from streamserve import AsyncClient

async def main():
    client = AsyncClient(sys.argv[1])  # never closed
    await client.start()
    print("started", flush=True)

asyncio.run(main())
print("ended", flush=True)
"""

# Each run returns as its call's reply comes: the client's reply reader is then writing its next read, where a
# cancellation that Python 3.11's asyncio.wait_for swallowed left it running, and asyncio.run() waiting for ever.
CALLING_SCRIPT = """
import asyncio, sys
from streamserve import AsyncClient

async def main(run):
    client = AsyncClient(sys.argv[1])  # never closed
    print((await client.call("rec", run))["body"], flush=True)

for run in range(3):
    asyncio.run(main(run))
print("ended", flush=True)
"""
RUNS_WITHIN_S = 30.0


def test_asyncio_run_ends_with_a_client_left_open(redis_url: str) -> None:
    ended = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_url], capture_output=True, text=True, timeout=30, check=False
    )
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.split() == ["started", "ended"]


async def test_asyncio_run_ends_after_calls_with_a_client_left_open(
    start_replica: StartReplica, settings: Settings
) -> None:
    await start_replica()
    await calls_then_asyncio_run_ends(settings.effective_redis_url)


async def calls_then_asyncio_run_ends(redis_url: str) -> None:
    """Run CALLING_SCRIPT on ``redis_url``, where deployment ``rec`` (tests.deployments:Recorder) runs: it ends, and
    every call was answered."""
    script = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CALLING_SCRIPT, redis_url, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(script.communicate(), RUNS_WITHIN_S)
    except TimeoutError:
        script.kill()
        out, err = await script.communicate()
        raise AssertionError(f"asyncio.run() did not end within {RUNS_WITHIN_S:g}s; printed {out!r}") from None
    assert script.returncode == 0, err.decode()
    assert out.decode().split() == ["0", "1", "2", "ended"]
