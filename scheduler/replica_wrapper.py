"""One replica as the scheduler manages it: the only code that changes a replica's state.

Each method is a probe or an action that never blocks: it looks at the
process and the heartbeat and returns what it saw, and ``transition`` is the
single place a state is validated, persisted and logged.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from enum import Enum

from streamserve.scheduler.types import Launcher, ReplicaStore, Timeouts
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat, ReplicaRecord
from streamserve.wire.states import ReplicaHealth, ReplicaState, check_replica_transition

logger = logging.getLogger(__name__)

# Why a live process stops heartbeating, most often: its heartbeat runs on the replica's event loop.
STOPPED_HINT = " (its process is stopped: SIGSTOP, Ctrl-Z, or a debugger)"
HUNG_HINT = (
    " (its process is alive: a handler that blocks the replica's event loop, such as an async def that calls"
    " time.sleep, or one C call that holds the GIL, stops its heartbeat; make blocking work a plain def, or"
    " asyncio.to_thread it)"
)


class Started(str, Enum):
    """What a look at a STARTING replica found."""

    READY = "ready"  # it reported ready: the import and the constructor are done
    STARTING = "starting"  # not decided yet
    FAILED = "failed"  # it reported an error, its process exited, or it took too long; ``failure`` says which
    GONE = "gone"  # an externally started worker removed its heartbeat: it was stopped before it was ready


class Alive(str, Enum):
    """What a look at a RUNNING replica found."""

    ALIVE = "alive"  # its process lives (where we can see it) and its heartbeat is fresh
    DRAINING = "draining"  # an externally started worker reports it is draining: someone asked it to stop
    GONE = "gone"  # an externally started worker removed its heartbeat: it drained and exited
    DEAD = "dead"  # its process exited or its heartbeat expired; ``failure`` says which
    UNHEALTHY = "unhealthy"  # its check_health() failed; ``failure`` says how


class Stopped(str, Enum):
    """What a look at a STOPPING replica found."""

    GONE = "gone"  # its process has exited (or, on another host, its heartbeat is gone)
    DRAINING = "draining"  # still finishing what it holds (killed once its deadline passes)
    KILLED = "killed"  # its drain deadline passed: it was killed, with what it still ran (it is gone by a later look)


class ReplicaWrapper:
    """A replica record plus the means to act on its process."""

    def __init__(
        self,
        record: ReplicaRecord,
        launcher: Launcher,
        store: ReplicaStore,
        deployment: str,
        moved: Callable[[ReplicaWrapper, ReplicaState], None] | None = None,
    ) -> None:
        """``moved(replica, old_state)`` is called after each transition (the owner files replicas by state)."""
        self.record = record
        self.id = ReplicaID.from_str(record.replica_id)
        self._launcher = launcher
        self._store = store
        self._deployment = deployment
        self.failure = ""
        self._seen_exited = False  # its process was found gone while STARTING (decided on the next look)
        self._moved = moved

    @property
    def state(self) -> ReplicaState:
        return self.record.state

    @property
    def version(self) -> str:
        return self.record.version

    @property
    def is_external(self) -> bool:
        """Started by someone else: known only by its heartbeat, never signalled."""
        return self.record.external

    @property
    def is_local(self) -> bool:
        """A process of ours on this host, which we can look at and signal."""
        return not self.record.external and self.record.host == self._launcher.host

    async def transition(self, new: ReplicaState, now_ms: int, **changes: object) -> None:
        """Validate ``state -> new`` against the table, persist it, log it once."""
        old = self.record.state
        check_replica_transition(old, new)
        self.record = self.record.model_copy(update={"state": new, "updated_ms": now_ms, **changes})
        if self._moved is not None:
            self._moved(self, old)
        await self._store.save(self._deployment, self.record)
        suffix = f" ({self.record.message})" if self.record.message else ""
        logger.info("replica %s: %s -> %s%s", self.id, old.value, new.value, suffix)

    # -- actions ------------------------------------------------------------

    async def start(self, now_ms: int, gpus: tuple[str, ...] = ()) -> None:
        """SHOULD_START -> STARTING: spawn the process (or take over one a killed scheduler left)."""
        pid = self._launcher.find(self.id) or self._launcher.start(self.id, gpus)
        await self.transition(ReplicaState.STARTING, now_ms, pid=pid, host=self._launcher.host, gpus=list(gpus))

    async def wait(self, now_ms: int, why: str) -> None:
        """A SHOULD_START replica that cannot start yet says why in its record (saved when the reason changes)."""
        if self.record.message != why:
            self.record = self.record.model_copy(update={"message": why, "updated_ms": now_ms})
            await self._store.save(self._deployment, self.record)
            logger.info("replica %s: waiting (%s)", self.id, why)

    async def stop(self, now_ms: int, graceful_timeout_s: float) -> None:
        """SHOULD_STOP -> STOPPING: SIGTERM now, SIGKILL once the deadline passes."""
        if self.record.pid and self.is_local:
            self._launcher.terminate(self.record.pid, self.id)
        deadline = now_ms + int(graceful_timeout_s * 1000)
        await self.transition(ReplicaState.STOPPING, now_ms, stop_deadline_ms=deadline)

    def force_kill(self) -> None:
        if self.record.pid and self.is_local:
            self._launcher.kill(self.record.pid, self.id)

    def forget_process(self) -> None:
        if self.record.pid and self.is_local:
            self._launcher.forget(self.record.pid)

    # -- probes --------------------------------------------------------------

    def _process_alive(self) -> bool | None:
        """True/False for a local process; None when we cannot see it (another host)."""
        if not self.record.pid or not self.is_local:
            return None
        return self._launcher.is_alive(self.record.pid, self.id)

    def check_started(
        self, beat: Heartbeat | None, last_beat_ms: int | None, now_ms: int, timeouts: Timeouts
    ) -> Started:
        """For a STARTING replica: ready, still starting, or failed (and why, in ``failure``).

        ``beat``: what its heartbeat last said; ``last_beat_ms``: when it last beat (None: it has no heartbeat).
        """
        if beat is not None and beat.health is ReplicaHealth.READY:
            return Started.READY
        if beat is not None and beat.health is ReplicaHealth.FAILED:
            self.failure = beat.message or "failed to start"
            return Started.FAILED
        if self.is_external:
            # Not ours to time out: a worker may load a model for as long as it keeps its heartbeat fresh.
            if beat is None:
                return Started.GONE
            if last_beat_ms is not None and now_ms - last_beat_ms > timeouts.heartbeat_timeout_ms:
                self.failure = f"no heartbeat for {(now_ms - last_beat_ms) / 1000:.1f}s while starting"
                return Started.FAILED
            return Started.STARTING
        if self._process_alive() is False:
            if not self._seen_exited:
                # Its last heartbeat (the error it reported just before exiting) may postdate our read of the
                # heartbeats: look once more next tick, so the reason is the replica's own and not just "exited".
                self._seen_exited = True
                return Started.STARTING
            self.failure = f"{exit_text(self._launcher.exit_code(self.record.pid))} while starting"
            return Started.FAILED
        if now_ms - self.record.updated_ms > timeouts.start_timeout_ms:
            self.failure = f"not ready after {timeouts.start_timeout_ms / 1000:g}s"
            return Started.FAILED
        return Started.STARTING

    def check_alive(
        self, beat: Heartbeat | None, last_beat_ms: int | None, now_ms: int, heartbeat_timeout_ms: int
    ) -> Alive:
        """For a RUNNING replica: OK while its process lives and its heartbeat is fresh (arguments as for
        ``check_started``)."""
        if self.is_external:
            if beat is None:
                return Alive.GONE
            if beat.health is ReplicaHealth.DRAINING:
                return Alive.DRAINING
        alive = self._process_alive()
        if alive is False:
            self.failure = exit_text(self._launcher.exit_code(self.record.pid))
            return Alive.DEAD
        last = last_beat_ms if last_beat_ms is not None else self.record.updated_ms
        if now_ms - last > heartbeat_timeout_ms:
            # (A process it cannot see, an adopted stray's or another host's, may be dead: no hint of a hang.)
            hint = (STOPPED_HINT if self._launcher.is_stopped(self.record.pid) else HUNG_HINT) if alive else ""
            self.failure = f"no heartbeat for {(now_ms - last) / 1000:.1f}s{hint}"
            return Alive.DEAD
        if beat is not None and beat.health is ReplicaHealth.UNHEALTHY and not self.is_external:
            self.failure = beat.message or "check_health() failed"
            return Alive.UNHEALTHY
        return Alive.ALIVE

    def check_stopped(self, last_beat_ms: int | None, now_ms: int, heartbeat_timeout_ms: int) -> Stopped:
        """For a STOPPING replica: OK once the process is gone; kills it past the deadline.

        Where we cannot see the process, its heartbeat tells: removed (it said
        goodbye) or expired (it died) both mean gone.
        """
        alive = self._process_alive()
        if alive is None and (last_beat_ms is None or now_ms - last_beat_ms > heartbeat_timeout_ms):
            return Stopped.GONE
        if alive is False:
            return Stopped.GONE
        if now_ms >= self.record.stop_deadline_ms:
            self.force_kill()
            return Stopped.KILLED
        return Stopped.DRAINING


def exit_text(code: int | None) -> str:
    """How a replica's process ended, from its exit code (None: unknown), as status and the logs say it: a signal
    by its name (a segfault is "killed by SIGSEGV", not "exited with code -11")."""
    if code is None:  # not a child of this scheduler's: an earlier one started it (`up` killed -9, say)
        return "process gone (started by an earlier scheduler: how it ended is not known)"
    if code < 0:
        try:
            return f"process killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"process killed by signal {-code}"
    return f"process exited with code {code}"
