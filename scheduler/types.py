"""Callable aliases and Protocols shared across packages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import AutoscaleRecord, DeploymentHealthRecord, ReplicaRecord

# Returns epoch milliseconds; injected so scheduler tests control time.
Clock = Callable[[], int]


@dataclass(frozen=True)
class Timeouts:
    """How long the scheduler waits on replicas, in ms."""

    heartbeat_timeout_ms: int
    start_timeout_ms: int


class Launcher(Protocol):
    """Starts and signals replica processes (scheduler.launcher.ProcessLauncher in production)."""

    host: str

    def start(self, replica_id: ReplicaID, gpus: tuple[str, ...] = ()) -> int: ...
    def find(self, replica_id: ReplicaID) -> int | None: ...
    def is_alive(self, pid: int, replica_id: ReplicaID) -> bool: ...
    def exit_code(self, pid: int) -> int | None: ...
    def is_stopped(self, pid: int) -> bool: ...
    def terminate(self, pid: int, replica_id: ReplicaID) -> None: ...
    def kill(self, pid: int, replica_id: ReplicaID) -> None: ...
    def forget(self, pid: int) -> None: ...


class ReplicaStore(Protocol):
    """Persists the scheduler's replica records, deployment verdicts and autoscaling decisions (None: drop it), and
    reads how many requests replicas hold (``held``: as their last heartbeats say; 0 for one with none)."""

    async def save(self, deployment: str, record: ReplicaRecord) -> None: ...
    async def remove(self, deployment: str, replica_id: str) -> None: ...
    async def save_health(self, deployment: str, record: DeploymentHealthRecord) -> None: ...
    async def save_autoscale(self, deployment: str, record: AutoscaleRecord | None) -> None: ...
    async def held(self, deployment: str, replica_ids: list[str]) -> dict[str, int]: ...
    async def log_line(self, deployment: str, record: ReplicaRecord, line: str) -> None: ...
