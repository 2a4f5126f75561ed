"""A replica the scheduler kills and forgets in one tick (a missed heartbeat) is reaped once it has ended: it stayed a
zombie of the scheduler until the scheduler next started a process."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from streamserve.runtime.settings import Settings
from streamserve.scheduler.launcher import ProcessLauncher
from streamserve.wire.ids import ReplicaID
from tests.harness.waiting import wait_for


def _state(pid: int) -> str:
    """The process's state letter (Z: a zombie), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def test_a_replica_killed_and_forgotten_at_once_is_reaped_by_the_next_look(settings: Settings) -> None:
    launcher = ProcessLauncher(settings)
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands for a replica the launcher started
    launcher._children[child.pid] = child
    try:
        launcher.forget(child.pid)  # not ended yet (as one SIGKILLed a moment ago, in the same tick, may not be) ...
        assert _state(child.pid) not in ("", "Z")
        os.killpg(child.pid, signal.SIGKILL)  # ... and it ends now
        other = ReplicaID.new("rec")

        def reaped() -> bool:
            launcher.is_alive(0, other)  # what the next tick does: look at its replicas
            return _state(child.pid) == ""

        wait_for(reaped, 5, lambda: f"the replica is left as {_state(child.pid)!r}")
    finally:
        if child.returncode is None:
            child.kill()
            child.wait(5)
