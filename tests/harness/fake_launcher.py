"""A launcher that starts nothing: the scheduler's replica processes as a table, for the unit and integration tests.

It keeps the pids it handed out and what was asked of each (terminated, killed, the GPUs it was given); a test ends a
"process" with ``exit``.
"""

from __future__ import annotations

import itertools

from streamserve.wire.ids import ReplicaID

HOST = "testhost"


class FakeLauncher:
    host = HOST

    def __init__(self) -> None:
        self._pids = itertools.count(1000)
        self.alive: dict[int, ReplicaID] = {}
        self.terminated: list[int] = []
        self.killed: list[int] = []
        self.stopped: set[int] = set()  # "processes" a test stopped (SIGSTOP)
        self.gpus: dict[int, tuple[str, ...]] = {}  # the devices each started process was given

    def start(self, replica_id: ReplicaID, gpus: tuple[str, ...] = ()) -> int:
        pid = next(self._pids)
        self.alive[pid] = replica_id
        self.gpus[pid] = gpus
        return pid

    def is_alive(self, pid: int, replica_id: ReplicaID) -> bool:
        return self.alive.get(pid) == replica_id

    def find(self, replica_id: ReplicaID) -> int | None:
        return next((pid for pid, rid in self.alive.items() if rid == replica_id), None)

    def is_stopped(self, pid: int) -> bool:
        return pid in self.stopped

    def exit_code(self, pid: int) -> int | None:
        """1 for a "process" it started that has ended; None for one still running, or not started by it."""
        return None if pid in self.alive or pid not in self.gpus else 1

    def terminate(self, pid: int, replica_id: ReplicaID) -> None:
        self.terminated.append(pid)

    def kill(self, pid: int, replica_id: ReplicaID) -> None:
        if self.alive.pop(pid, None) is not None:
            self.killed.append(pid)

    def forget(self, pid: int) -> None:
        pass

    def exit(self, pid: int) -> None:
        self.alive.pop(pid, None)
