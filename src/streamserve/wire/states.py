"""Lifecycle states and their allowed transitions: the one table for each lifecycle."""

from __future__ import annotations

from enum import Enum

from streamserve.wire.errors import StreamServeError


class ReplicaState(str, Enum):
    """Where a replica is in its life, as the scheduler records it."""

    # The scheduler decided to start it; no process exists yet.
    SHOULD_START = "SHOULD_START"

    # The process runs and is importing the deployment or running its constructor.
    STARTING = "STARTING"

    # The replica reported ready and reads requests.
    RUNNING = "RUNNING"

    # The scheduler decided to stop it; it has not been signalled yet.
    SHOULD_STOP = "SHOULD_STOP"

    # SIGTERM was sent; the replica drains its in-flight requests.
    STOPPING = "STOPPING"

    # The process is gone; the record is about to be removed.
    STOPPED = "STOPPED"


_S = ReplicaState
# Every allowed move, and what triggers it. A STOPPED replica is never revived (a new one is started); a replica told to
# stop is always signalled (STOPPING) before it counts as stopped.
REPLICA_TRANSITIONS: dict[ReplicaState, dict[ReplicaState, str]] = {
    _S.SHOULD_START: {
        _S.STARTING: "the scheduler spawned its process, or took over one that a killed scheduler had spawned",
        _S.STOPPED: "retired before it was spawned (scaled down, new version), or its process could not be spawned",
    },
    _S.STARTING: {
        _S.RUNNING: "its heartbeat says ready: the import and the constructor are done",
        _S.SHOULD_STOP: "retired while still starting (scaled down, or a newer version is wanted)",
        _S.STOPPED: "it failed to start: it reported the error, its process exited, or start_timeout_s passed",
    },
    _S.RUNNING: {
        _S.SHOULD_STOP: "retired: scaled down, rolled to a new version, deleted, the scheduler shuts down, or "
        "its check_health() failed (it is replaced)",
        _S.STOPPING: "an externally started worker reported it is draining (whoever runs it asked it to stop)",
        _S.STOPPED: "its process died, its heartbeat expired, or an externally started worker said goodbye",
    },
    _S.SHOULD_STOP: {
        _S.STOPPING: "the scheduler sent SIGTERM and set the drain deadline (graceful_shutdown_timeout_s)",
    },
    _S.STOPPING: {
        _S.STOPPED: "its process exited after draining, was killed at the deadline, or its heartbeat ended",
    },
    _S.STOPPED: {},
}

# States that count towards a deployment's target number of replicas.
ACTIVE_REPLICA_STATES = frozenset({ReplicaState.SHOULD_START, ReplicaState.STARTING, ReplicaState.RUNNING})
# States in which a replica that reads its own record knows it should drain and exit.
RETIRED_REPLICA_STATES = frozenset({ReplicaState.SHOULD_STOP, ReplicaState.STOPPING, ReplicaState.STOPPED})


class InvalidTransitionError(StreamServeError):
    """A state change that the transition table does not allow."""


def check_replica_transition(old: ReplicaState, new: ReplicaState) -> None:
    """Raise InvalidTransitionError unless ``old -> new`` is in REPLICA_TRANSITIONS."""
    if new not in REPLICA_TRANSITIONS[old]:
        raise InvalidTransitionError(f"replica cannot go from {old.value} to {new.value}")


class ReplicaHealth(str, Enum):
    """What a replica says about itself in its heartbeat."""

    # Importing the deployment and running its constructor.
    STARTING = "starting"

    # Serving requests.
    READY = "ready"

    # Got SIGTERM: reads nothing new, finishes what it holds.
    DRAINING = "draining"

    # Could not start (import error, constructor raised); the message says why.
    FAILED = "failed"

    # Its deployment's check_health() raised or did not answer within health_check_timeout_s; the message says
    # why. The scheduler replaces it; an externally scaled worker exits 1 instead, for its supervisor to restart.
    UNHEALTHY = "unhealthy"


class DeploymentHealth(str, Enum):
    """How a deployment is doing, as the scheduler sees it."""

    # Replicas are starting, stopping or rolling towards the target.
    UPDATING = "UPDATING"

    # The target number of replicas of the current version are RUNNING.
    HEALTHY = "HEALTHY"

    # Replicas keep failing to start; the message says why. Retried with backoff.
    UNHEALTHY = "UNHEALTHY"


class GoalStatus(str, Enum):
    """Where a goal (one desired-state write) stands."""

    # The scheduler is working towards it.
    PENDING = "PENDING"

    # The deployment runs the target count of the target version (or is gone, for a delete).
    DONE = "DONE"

    # Replicas of the target keep failing to start; the message says why.
    FAILED = "FAILED"

    # A later write to the same deployment replaced it before it was reached.
    CANCELLED = "CANCELLED"


FINAL_GOAL_STATUSES = frozenset({GoalStatus.DONE, GoalStatus.FAILED, GoalStatus.CANCELLED})


class JobStatus(str, Enum):
    """An asynchronous job's status as callers see it (RQ keeps the job and moves it; we only read it)."""

    # Waiting for a job worker (RQ's queued, deferred or scheduled).
    QUEUED = "queued"

    # A job worker has sent the call to the deployment and waits for its reply.
    STARTED = "started"

    # The deployment answered; the job holds its result until the result TTL passes.
    FINISHED = "finished"

    # The call raised (the user's error, a timeout, no replica) or the job was stopped; the job holds the error.
    FAILED = "failed"

    # Cancelled (``DELETE /-/jobs/<id>``) before it ended: it never ran, or its call was cancelled (RQ's spelling).
    CANCELED = "canceled"


# The statuses of a job that has ended: it will not change any more (until its TTL passes and it is gone).
ENDED_JOB_STATUSES = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED})
