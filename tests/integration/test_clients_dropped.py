"""A Client dropped without close() (made per request in a web view, say) ends its thread and its Redis connections
once it is garbage-collected, with a ResourceWarning as an unclosed file gives: each one used to keep both for good,
until Redis ran out of connections for every client of the farm. An AsyncClient dropped without aclose() likewise
ends its tasks and closes its connections.

The clients are made and dropped in a process of their own, whose open sockets are all theirs."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from streamserve.runtime.settings import Settings
from tests.integration.conftest import StartReplica

SCRIPT = """
import gc, os, sys, threading, time, warnings
from streamserve import Client

def sockets():
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}"))

def client_threads():
    return sum(t.name == "streamserve-client" for t in threading.enumerate())

def use_and_drop(n):
    client = Client(sys.argv[1])  # never closed
    assert client.call("rec", n, timeout=10)["body"] == n

before = sockets()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n in range(5):
        use_and_drop(n)
    submitted = Client(sys.argv[1]).submit("rec", 5, timeout=10)  # the client dropped, its call under way
    gc.collect()
    assert submitted.result(timeout=10)["body"] == 5
    del submitted
    gc.collect()
    deadline = time.monotonic() + 10
    while (client_threads() or sockets() > before) and time.monotonic() < deadline:
        time.sleep(0.05)
print("threads", client_threads(), "sockets", sockets() - before,
      "warned", sum("dropped without close" in str(w.message) for w in caught), flush=True)
os._exit(0)
"""


ASYNC_SCRIPT = """
import asyncio, gc, os, sys, time, warnings
from streamserve import AsyncClient

def sockets():
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}"))

async def use_and_drop(n):
    client = AsyncClient(sys.argv[1])  # never closed
    assert (await client.call("rec", n, timeout=10))["body"] == n
    client = AsyncClient(sys.argv[1])
    await client.submit_job("rec", n)  # a job connection too

async def main():
    before = sockets()
    for n in range(5):
        await use_and_drop(n)
    under_way = asyncio.ensure_future(AsyncClient(sys.argv[1]).call("rec", 5, timeout=10))  # the client dropped
    gc.collect()
    assert (await under_way)["body"] == 5
    del under_way
    gc.collect()
    deadline = time.monotonic() + 10
    others = lambda: asyncio.all_tasks() - {asyncio.current_task()}
    while (others() or sockets() > before) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(others()), sockets() - before

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("error" if sys.argv[2] == "error" else "always")  # (-W error: raised in the finalizer)
    tasks, sockets_left = asyncio.run(main())
print("tasks", tasks, "sockets", sockets_left,
      "warned", sum("dropped without aclose" in str(w.message) for w in caught), flush=True)
os._exit(0)
"""


def _run(script: str, settings: Settings, warnings: str = "always") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, settings.effective_redis_url, warnings],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_clients_dropped_without_close_end_their_threads_and_connections(
    start_replica: StartReplica, settings: Settings
) -> None:
    await start_replica()
    ran = await asyncio.to_thread(_run, SCRIPT, settings)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.split() == ["threads", "0", "sockets", "0", "warned", "6"], ran.stdout + ran.stderr[-3000:]


@pytest.mark.parametrize("warnings", ["always", "error"])
async def test_async_clients_dropped_without_aclose_end_their_tasks_and_connections(
    start_replica: StartReplica, settings: Settings, warnings: str
) -> None:
    await start_replica()
    ran = await asyncio.to_thread(_run, ASYNC_SCRIPT, settings, warnings)
    assert ran.returncode == 0, ran.stderr[-3000:]
    warned = "11" if warnings == "always" else "0"  # (as errors, raised where the collector ran: not recorded)
    assert ran.stdout.split() == ["tasks", "0", "sockets", "0", "warned", warned], ran.stdout + ran.stderr[-3000:]
