"""A handle used in a process that then forks (a multiprocessing pool with the fork start method) works in the
child: the child's calls got the parent's home, whose loop thread did not come along, and waited for ever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
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


def _run(env: dict[str, str]) -> tuple[int, str, str]:
    """The script in a process group of its own, ended whole should it hang (its forked child with it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        out, err = b"", b"hung"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out.decode(), err.decode()


async def test_a_handle_used_before_a_fork_works_in_the_child(start_replica: StartReplica, settings: Settings) -> None:
    await start_replica()
    returncode, out, err = await asyncio.to_thread(_run, {**os.environ, "REDIS_URL": settings.effective_redis_url})
    assert returncode == 0, err[-3000:]
    assert out.split() == ["child", "0", "parent", "again", "again"], out + err[-3000:]
