"""A blocking Client made before os.fork() serves both processes (multiprocessing's fork pools, gunicorn --preload):
the child gets a client of its own and leaves the parent's connections alone."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from streamserve.client import Client
from streamserve.runtime.settings import Settings
from tests.integration.conftest import StartReplica

# The child's call may take this long (the first call connects and makes a reply stream)...
CALL_TIMEOUT_S = 5.0
# ...and the child must have ended within this, else it is killed and the test fails.
CHILD_WITHIN_S = 15.0
# The child's exit statuses.
CALLED, WRONG_ANSWER, CALL_FAILED = 0, 2, 3


def call_then_exit(client: Client) -> None:
    """The child: one call with a timeout, then close the inherited client, then exit with what came of it."""
    status = CALL_FAILED
    try:
        answer = client.call("rec", "child", timeout=CALL_TIMEOUT_S)
        status = CALLED if answer["body"] == "child" else WRONG_ANSWER
        client.close()
    finally:
        os._exit(status)


async def exit_status(pid: int, within_s: float) -> int | None:
    """The exit status of child ``pid``, waited for without blocking the replica's loop; None if it had not ended
    within ``within_s`` (it is then killed)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        await asyncio.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


# (Python 3.12 warns of any fork in a process with threads, as pytest's is: the client's fork is the point here.)
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
async def test_a_client_made_before_fork_calls_from_the_child_and_still_from_the_parent(
    start_replica: StartReplica, settings: Settings
) -> None:
    await start_replica()
    client = Client(settings=settings)
    try:
        assert (await asyncio.to_thread(client.call, "rec", "before", timeout=CALL_TIMEOUT_S))["body"] == "before"
        pid = os.fork()
        if pid == 0:
            call_then_exit(client)
        status = await exit_status(pid, CHILD_WITHIN_S)
        assert status is not None, (
            f"the child's call (timeout {CALL_TIMEOUT_S:g} s) had not ended in {CHILD_WITHIN_S} s"
        )
        assert status == CALLED
        assert (await asyncio.to_thread(client.call, "rec", "after", timeout=CALL_TIMEOUT_S))["body"] == "after"
    finally:
        await asyncio.to_thread(client.close)
