"""A blocking Client made before os.fork() serves both processes (multiprocessing's fork pools, gunicorn --preload):
the child gets a client of its own and leaves the parent's connections alone."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest

from streamserve.client import Client
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import UnavailableError
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


def test_a_subprocess_started_with_a_preexec_fn_gets_no_client_of_its_own(settings: Settings) -> None:
    """Between its fork and its exec, a subprocess runs its preexec_fn, and the at-fork hooks: a client renewed there
    would start a thread and build a connection for nothing (and risk a lock the parent held). It is renewed on use."""
    client = Client(settings=settings)
    read_end, write_end = os.pipe()
    try:

        def look() -> None:  # (runs in the child, before `true` replaces it)
            os.write(write_end, b"a new loop thread" if client._thread.is_alive() else b"nothing")

        subprocess.run(["true"], preexec_fn=look, check=True, timeout=30)
        assert os.read(read_end, 64) == b"nothing"
    finally:
        os.close(read_end)
        os.close(write_end)
        client.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
async def test_a_stream_started_before_fork_goes_on_in_the_parent_and_the_child_is_told(
    start_replica: StartReplica, settings: Settings
) -> None:
    await start_replica(import_path="tests.stream_deployments:count_to")
    client = Client(settings=settings)
    try:
        chunks = client.stream("rec", 3, timeout=CALL_TIMEOUT_S)
        first = await asyncio.to_thread(next, chunks)
        pid = os.fork()
        if pid == 0:
            status = CALL_FAILED
            try:
                next(chunks)
            except UnavailableError as exc:
                status = CALLED if "started before os.fork() goes on in the parent only" in str(exc) else WRONG_ANSWER
            finally:
                os._exit(status)
        assert await exit_status(pid, CHILD_WITHIN_S) == CALLED
        assert [first, *(await asyncio.to_thread(list, chunks))] == [{"i": 0}, {"i": 1}, {"i": 2}]
    finally:
        await asyncio.to_thread(client.close)
