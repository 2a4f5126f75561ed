"""A replica's heartbeat: written every heartbeat_interval_s, and the scheduler's record of it read back and obeyed.

The heartbeat says how the replica is (its health, what it holds, the code
version it runs); the scheduler turns those reports into lifecycle
transitions. The same transaction reads the replica's record in the
scheduler's replica hash, which says whether a farm still counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import ExecAbortError

from streamserve.control.heartbeats import News, news_of, queue_beats, queue_removal
from streamserve.runtime.lifeline import FARM_GONE_DRAIN_S, inherited, watch
from streamserve.runtime.processes import is_running
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RETRYABLE_ERRORS, WriteRefusals, refuses_writes
from streamserve.wire.errors import ProtocolError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import Heartbeat, ReplicaRecord, now_ms
from streamserve.wire.states import RETIRED_REPLICA_STATES, ReplicaHealth
from streamserve.workers.departure import Departure
from streamserve.workers.slots import Slots

logger = logging.getLogger(__name__)


def beat_may_fail(exc: BaseException) -> bool:
    """Whether a beat that failed with ``exc`` is simply tried again at the next interval: Redis is away, or refused
    the write for lack of memory (a transaction says EXECABORT), which may last only a moment, as while a large reply
    arrives. Only a replica that stays silent for heartbeat_timeout_s is dead to the scheduler."""
    return isinstance(exc, (*RETRYABLE_ERRORS, ExecAbortError)) or refuses_writes(exc)


class ReplicaHeartbeat:
    """Beats for one replica until stopped, and makes it leave when its record or its `streamserve up` is gone."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        replica_id: ReplicaID,
        slots: Slots,
        leave: Callable[[Departure], None],
        leaving: Callable[[], bool],
        takes_over: str | None,
    ) -> None:
        """``leave``: stops the replica. ``leaving``: whether it is leaving anyway (its record decides nothing then).
        ``takes_over``: the replica whose last heartbeat the first beat replaces."""
        self._settings = settings
        self._redis = redis
        self._keys = settings.keys
        self._replica_id = replica_id
        self._consumer = replica_id.to_str()
        self._name = replica_id.deployment
        self._slots = slots
        self._leave = leave
        self._leaving = leaving
        self._takes_over = takes_over
        self.health = ReplicaHealth.STARTING
        self.message = ""  # why it failed or is unhealthy, for `status`
        self.version = ""  # the code version it runs, once loaded (the config may move on meanwhile)
        self.user_config = ""  # the user_config it runs with, once loaded, and one it refused (Heartbeat's fields)
        self.refused_user_config = ""
        self.models: Callable[[], list[str]] = list  # the models it holds (a multiplexing deployment's)
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()  # set when the replica exits: the loop ends
        self._told: News | None = None  # what its last heartbeat said (heartbeats.news_of), None before the first
        # A full Redis refuses every beat: said once per episode, not once a beat.
        self._memory = WriteRefusals(logger, f"replica {replica_id}")
        # None until a scheduler has recorded this replica (then a record that vanishes means "leave"); then whether
        # its record says it is an externally started worker.
        self._counted: bool | None = None
        self._landed = time.monotonic()  # when its last beat reached Redis
        self._beat_before = False  # a beat of its own is known to have reached Redis
        self._silent_limit = settings.heartbeat_timeout_s / 2

    def vouch(self) -> Awaitable[None] | None:
        """Before the replica runs what a read brought: when no beat of its own has reached Redis for half the
        heartbeat timeout (Redis, or the network to it, was away), a beat to await now, which obeys the answer (and
        raises what the beat raised: Redis away again); else None, at once (a read's cost: no coroutine). The
        scheduler may have written the replica off meanwhile and freed what it held; what it reads before it learns
        so at its next beat would be run twice."""
        if time.monotonic() - self._landed > self._silent_limit:
            return self._beat()
        return None

    def stop(self) -> None:
        """End the loop (at once, if it is waiting for its next beat)."""
        self._stop.set()

    async def run(self) -> None:
        """Beat every heartbeat_interval_s until stopped."""
        supervisor = self._settings.supervisor
        lifeline = inherited(self._settings.lifeline_fd)
        unwatch = None if lifeline is None else watch(lifeline, self._farm_gone)
        try:
            await self._beat_until_stopped(None if lifeline is not None else supervisor)
        finally:
            if unwatch is not None:
                unwatch()

    async def _beat_until_stopped(self, supervisor: str | None) -> None:
        """The beats; and, for a replica of `up` that has no lifeline, a look at ``supervisor`` before each."""
        # Ends on the flag as well as on cancellation: redis-py can swallow a cancellation that lands in a write
        # (CI saw a replica whose heartbeat task went on beating after it was cancelled, so it never exited).
        while not self._stop.is_set():
            if supervisor is not None and not is_running(supervisor):
                self._farm_gone()
                supervisor = None
            try:
                await self._beat()
            except Exception as exc:
                if not beat_may_fail(exc):
                    raise
                if not self._memory.refused(exc):
                    logger.warning("replica %s: heartbeat failed: %s", self._replica_id, exc)
            else:
                self._memory.accepted()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._settings.heartbeat_interval_s)

    def _farm_gone(self) -> None:
        """The `streamserve up` that started this replica died (its lifeline was cut, or it is no longer running):
        nobody will stop it, and its Redis is likely gone with it, so it leaves at once."""
        pid = (self._settings.supervisor or "?").partition(":")[0]
        why = f"the `streamserve up` that started it (pid {pid}) is gone"
        self._leave(Departure(1, why, drain_limit_s=FARM_GONE_DRAIN_S, farm_gone=True))

    async def set_health(self, health: ReplicaHealth) -> None:
        """Report a change of health at once (or with the loop's next beat, if Redis cannot take this one)."""
        self.health = health
        await self.say_now()

    async def say_now(self) -> None:
        """Beat now, for what changed (health, user_config) to reach the scheduler's next tick (or with the loop's
        next beat, if Redis cannot take this one)."""
        health = self.health
        try:
            await self._beat()
        except Exception as exc:
            if not beat_may_fail(exc):
                raise
            if not self._memory.refused(exc):
                logger.warning("replica %s: heartbeat (%s) failed: %s", self._replica_id, health.value, exc)

    async def _beat(self) -> None:
        # One beat at a time, each built once it holds the lock: the loop's beat must never land after (and over)
        # the one that reports a change of health, such as FAILED just before the process exits.
        async with self._lock:
            await self._write_beat()

    async def _write_beat(self) -> None:
        beat = Heartbeat(
            ts_ms=now_ms(),
            health=self.health,
            pid=os.getpid(),
            host=socket.gethostname(),
            ongoing=self._slots.held,
            message=self.message,
            version=self.version,
            models=self.models(),
            user_config=self.user_config,
            refused_user_config=self.refused_user_config,
        )
        news = news_of(beat)
        async with self._redis.pipeline(transaction=True) as pipe:
            beats = {self._consumer: (beat.ts_ms, beat.encode())}
            queue_beats(pipe, self._keys, self._name, beats, news != self._told)
            if self._takes_over is not None:
                queue_removal(pipe, self._keys, self._name, [self._takes_over])
            pipe.hget(self._keys.replicas(self._name), self._consumer)
            self._told = None  # unknown until the transaction's answer comes: a lost one may or may not have run
            added, *_, record = await pipe.execute()
        # HSET counts the fields it added: its own beat's, when it was not there. Having beaten before, that means
        # the scheduler removed its heartbeat (a write-off), though it may never have seen its record.
        removed, self._beat_before = self._beat_before and added == 1, True
        self._takes_over, self._told = None, news
        self._landed = time.monotonic()
        self._obey(record, removed)

    def _obey(self, raw_record: bytes | None, removed: bool) -> None:
        """Leave when the farm no longer counts this replica: its record says stop, or was there and is gone, or
        its heartbeat was removed (``removed``).

        The scheduler signals the replicas it can see; this covers the rest (another host's, a killed farm's,
        one started by hand that the scheduler found it has no room for). A replica that never had a record
        (no scheduler runs, or one has not looked yet) goes on serving.

        An externally scaled worker (its record says so) is never stopped by the scheduler, which writes it off only
        when its heartbeat stops (a host cut off from Redis, a stalled process) and frees what it held for other
        workers to run. Back, it exits 1, for its supervisor to start it again (a new worker, which joins): serving
        on unseen, what it read would be freed and run again, over and over.
        """
        if self._leaving():
            return
        if raw_record is None:
            if self._counted is not None:
                self._leave_retired("its record is gone from the scheduler's replica hash: no farm counts it")
            elif removed:
                # Stalled before its beat brought its record back, or before a scheduler saw it live: either way
                # what it held was freed, as for a worker written off. Unseen, it would serve on (its beats say
                # nothing new, so the scheduler would not look again).
                self._counted = True
                self._leave_retired("its heartbeat was removed while it was silent")
            return
        try:
            record = ReplicaRecord.decode(raw_record)
        except ProtocolError:
            return
        self._counted = record.external
        if record.state in RETIRED_REPLICA_STATES:
            self._leave_retired(f"its record says {record.state.value}")

    def _leave_retired(self, why: str) -> None:
        if self._counted:
            self._leave(Departure(1, f"the scheduler wrote it off ({why}): exiting, for its supervisor to start it"))
        else:
            self._leave(Departure(0, f"the scheduler retired it ({why})"))
