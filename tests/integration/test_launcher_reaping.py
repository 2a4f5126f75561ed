"""A replica the scheduler kills and forgets in one tick (a missed heartbeat) is reaped once it has ended: it stayed a
zombie of the scheduler until the scheduler next started a process."""

from __future__ import annotations

import os
import signal
import subprocess

from streamserve.runtime.processes import process_state
from streamserve.runtime.settings import Settings
from streamserve.scheduler.launcher import ProcessLauncher
from streamserve.wire.ids import ReplicaID
from tests.harness.waiting import wait_for


def test_a_replica_killed_and_forgotten_at_once_is_reaped_by_the_next_look(settings: Settings) -> None:
    launcher = ProcessLauncher(settings)
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands for a replica the launcher started
    launcher._children[child.pid] = child
    try:
        launcher.forget(child.pid)  # not ended yet (as one SIGKILLed a moment ago, in the same tick, may not be) ...
        assert process_state(child.pid) not in ("", "Z")
        os.killpg(child.pid, signal.SIGKILL)  # ... and it ends now
        other = ReplicaID.new("rec")

        def reaped() -> bool:
            launcher.is_alive(0, other)  # what the next tick does: look at its replicas
            return process_state(child.pid) == ""

        wait_for(reaped, 5, lambda: f"the replica is left as {process_state(child.pid)!r}")
    finally:
        if child.returncode is None:
            child.kill()
            child.wait(5)


def test_a_stopped_process_is_told_from_a_running_one(settings: Settings) -> None:
    """A replica written off for its silence: stopped (SIGSTOP), it is not a handler blocking its loop."""
    launcher = ProcessLauncher(settings)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert not launcher.is_stopped(sleeper.pid)
        os.kill(sleeper.pid, signal.SIGSTOP)
        wait_for(lambda: launcher.is_stopped(sleeper.pid), 5, "the process was never seen stopped")
        os.kill(sleeper.pid, signal.SIGCONT)
        wait_for(lambda: not launcher.is_stopped(sleeper.pid), 5, "the process was never seen running again")
    finally:
        sleeper.kill()
        sleeper.wait(10)
    assert not launcher.is_stopped(sleeper.pid)
