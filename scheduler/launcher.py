"""Starting and signalling replica processes on this host: the only code that touches OS processes.

Replicas run in their own session (process group), detached from the
scheduler, so a scheduler crash leaves them serving. A process is only ever
signalled after checking that it still is the replica we think it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
from pathlib import Path

from streamserve.control.resources import GPU_DEVICES_ENV
from streamserve.runtime.lifeline import inherited
from streamserve.runtime.processes import process_ref, process_state, role_command, runs_replica
from streamserve.runtime.settings import Settings
from streamserve.transport.cluster_nodes import nodes_env
from streamserve.wire.ids import ReplicaID

logger = logging.getLogger(__name__)


# How long ``forget`` waits for a replica killed a moment ago to end (it blocks the scheduler's loop meanwhile).
FORGET_WAIT_S = 0.1


class ProcessLauncher:
    """Starts ``python -m streamserve worker`` processes and tells whether they live."""

    def __init__(self, settings: Settings) -> None:
        self._env = settings.user_code_env(os.environ)  # without the API key: replicas run user code
        # `up`'s lifeline, handed down to each replica so that it leaves when `up` dies (runtime/lifeline.py).
        lifeline = inherited(settings.lifeline_fd)
        self._pass_fds = () if lifeline is None else (lifeline,)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # Forgotten before they had ended (killed in the same tick): reaped once they have (_reap_departed).
        self._departed: list[subprocess.Popen[bytes]] = []
        self._redis_url = settings.effective_redis_url
        self.host = socket.gethostname()

    def start(self, replica_id: ReplicaID, gpus: tuple[str, ...] = ()) -> int:
        """Spawn the replica in a new session, seeing only ``gpus`` if it asked for any; return its pid (also
        its process group id)."""
        self._reap_departed()
        cmd = role_command("worker", replica_id.deployment, "--replica-id", replica_id.to_str())
        proc = subprocess.Popen(
            cmd, env=self.env(gpus), stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=self._pass_fds
        )
        self._children[proc.pid] = proc
        return proc.pid

    def env(self, gpus: tuple[str, ...] = ()) -> dict[str, str]:
        """A replica's environment, started now: with the Redis Cluster's nodes as known now (the URL's node may be
        the one that is down: transport/cluster_nodes.py), seeing only ``gpus`` if it asked for any."""
        env = {**self._env, **nodes_env(self._redis_url)}
        if gpus:
            env[GPU_DEVICES_ENV] = ",".join(gpus)
        return env

    def is_alive(self, pid: int, replica_id: ReplicaID) -> bool:
        """True while the process runs and still is this replica (guards against pid reuse)."""
        self._reap_departed()
        child = self._children.get(pid)
        if child is not None:
            return not _ended(child)
        return runs_replica(pid, replica_id)

    def find(self, replica_id: ReplicaID) -> int | None:
        """The pid of a process already running this replica, if any.

        A scheduler killed between spawning a replica and recording that it did
        leaves a live process behind a SHOULD_START record; the next leader
        takes that process over instead of starting a second one.
        """
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and runs_replica(int(proc.name), replica_id):
                return int(proc.name)
        return None

    def is_stopped(self, pid: int) -> bool:
        """Whether the process is stopped (SIGSTOP, a debugger), not running."""
        return process_state(pid) in ("T", "t")

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a child that has ended, if we started it."""
        child = self._children.get(pid)
        return child.returncode if child is not None and _ended(child) else None

    def terminate(self, pid: int, replica_id: ReplicaID) -> None:
        """Ask the replica to drain and exit."""
        if self.is_alive(pid, replica_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def kill(self, pid: int, replica_id: ReplicaID) -> None:
        """End the replica's whole process group at once."""
        if self.is_alive(pid, replica_id):
            logger.warning("replica %s (pid %d) did not stop in time: killing its process group", replica_id, pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def forget(self, pid: int) -> None:
        """Drop a replica's process that has ended: ours is reaped, what it left in its process group killed first
        (_ended); one an earlier scheduler started (adopted), whose group is its pid too, has its group swept."""
        child = self._children.pop(pid, None)
        if child is None:
            _sweep_group_of_ended(pid)
        elif not _ended(child):  # SIGKILLed a moment ago: a zombie until the next start, had it been dropped
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(FORGET_WAIT_S)  # (gone in a few ms, as a rule: then reaped here, whatever comes next)
            if not _ended(child):
                self._departed.append(child)
        self._reap_departed()

    def _reap_departed(self) -> None:
        if self._departed:
            self._departed = [child for child in self._departed if not _ended(child)]


def _sweep_group_of_ended(pid: int) -> None:
    """SIGKILL what is left in the process group of ``pid``, an adopted replica that has ended, as _ended does for
    ours. Only once ``pid`` names no live process: a live one is the replica still, or already another process. Linux
    gives out no pid that still names a process group, so the group's members are the replica's (unless its group
    emptied and the pid was taken and made a group again in the seconds since: not in practice)."""
    if process_ref(pid) is not None:  # (None too for a zombie: it has ended, only its parent's wait is left)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _ended(child: subprocess.Popen[bytes]) -> bool:
    """Whether a replica we started has ended. When it has, what it left in its process group (processes its user
    code started: a model server, a pool) is killed before the replica is reaped: they would run on for ever, and
    until the reaping the replica's pid, which names the group, cannot be another process's."""
    if child.returncode is not None:
        return True
    try:
        if os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return False
    except ChildProcessError:  # reaped already
        child.poll()
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.poll()
    return True
