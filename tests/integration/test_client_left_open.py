"""A script that never closes its AsyncClient still ends: asyncio.run() cancels the client's tasks, and each of them
stops (redis-py can swallow a cancellation that lands in a pub/sub read; the config subscription must not)."""

from __future__ import annotations

import subprocess
import sys

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


def test_asyncio_run_ends_with_a_client_left_open(redis_url: str) -> None:
    ended = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_url], capture_output=True, text=True, timeout=30, check=False
    )
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.split() == ["started", "ended"]
