"""A handle used in a process that then forks (a multiprocessing pool with the fork start method) works in the
child: the child's calls got the parent's home, whose loop thread did not come along, and waited for ever."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from streamserve.runtime.settings import Settings
from tests.integration.conftest import StartReplica

SCRIPT = """
import os, sys
import streamserve

rec = streamserve.handle("rec")
assert rec.call("parent")["body"] == "parent"
pid = os.fork()
if pid == 0:
    try:
        ok = rec.call("child")["body"] == "child" and streamserve.handle("rec").call(2)["body"] == 2
    finally:
        os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "parent again", rec.call("again")["body"], flush=True)
os._exit(0)
"""


async def test_a_handle_used_before_a_fork_works_in_the_child(start_replica: StartReplica, settings: Settings) -> None:
    await start_replica()
    env = {**os.environ, "REDIS_URL": settings.effective_redis_url}
    ran = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.split() == ["child", "0", "parent", "again", "again"], ran.stdout + ran.stderr[-3000:]
