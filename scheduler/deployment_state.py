"""Reconciling one deployment: its replicas, its target, and the steps between them."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property

from streamserve.control.resources import GpuAllocator
from streamserve.scheduler.autoscaler import NO_LOAD, AutoscalePolicy, Load
from streamserve.scheduler.heartbeat_reader import Beats
from streamserve.scheduler.replica_wrapper import Alive, ReplicaWrapper, Started, Stopped
from streamserve.scheduler.types import Launcher, ReplicaStore, Timeouts
from streamserve.transport.backoff import Backoff
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import ProtocolError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import AutoscaleRecord, DeploymentHealthRecord, ReplicaRecord
from streamserve.wire.states import ACTIVE_REPLICA_STATES, DeploymentHealth, ReplicaHealth, ReplicaState

logger = logging.getLogger(__name__)

# Consecutive failed starts after which a deployment is reported UNHEALTHY.
UNHEALTHY_AFTER_FAILURES = 3
# How long the deployment's status says that a replica was replaced for failing its check_health().
REPLACED_NOTE_MS = 5 * 60 * 1000
# Replicas replaced for failing their check_health() this many times within KEEPS_FAILING_MS: the deployment is
# UNHEALTHY, not HEALTHY between two replacements (a check that always fails read healthy two times in three, to a
# probe or an alert).
KEEPS_FAILING = 3
KEEPS_FAILING_MS = 60_000
# How the record of a replica stopped for failing its check_health() begins: its end may be a request's doing (one
# that wedges it), so what it still ran is charged as a dead replica's, unlike a rollout's or a scale-down's.
UNHEALTHY_STOP = "unhealthy: "
# ACTIVE_REPLICA_STATES in lifecycle order (the enum's): walked in one order, ties in the retire order break alike.
_ACTIVE_IN_ORDER = tuple(state for state in ReplicaState if state in ACTIVE_REPLICA_STATES)
FIRST_START_BACKOFF_S = 0.5
# After each failed start in a row the next start waits twice as long, from FIRST_ up to MAX_START_BACKOFF_S.
MAX_START_BACKOFF_S = 30.0


@dataclass(frozen=True)
class Target:
    """What one deployment should look like; ``cfg is None`` means it was deleted.

    ``shutting_down`` (the scheduler stops with its replicas) asks for zero
    replicas without treating the deployment as deleted. ``autoscaled`` is the
    count the autoscaler decided; it replaces the config's count when the
    deployment has an ``autoscaling_config``.
    """

    cfg: DeploymentConfig | None
    shutting_down: bool = False
    autoscaled: int | None = None

    @property
    def count(self) -> int:
        """How many replicas the scheduler itself keeps (none for an externally scaled deployment)."""
        if self.cfg is None or self.shutting_down:
            return 0
        return self.cfg.wanted_replicas(self.autoscaled)

    @property
    def external(self) -> bool:
        """Its replicas are started elsewhere: the scheduler watches them and starts none."""
        return self.cfg is not None and self.cfg.external_scaler_enabled

    @cached_property
    def version(self) -> str | None:
        """The code version the replicas must run; computed once per target (each tick compares every replica's
        with it: at 100,000 replicas, hashing the config each time was most of a tick)."""
        return self.cfg.code_version() if self.cfg is not None else None

    @cached_property
    def user_config(self) -> str:
        """The digest of the user_config the replicas must run with ("" for a deleted deployment)."""
        return self.cfg.user_config_digest() if self.cfg is not None else ""

    @property
    def graceful_shutdown_timeout_s(self) -> float:
        return self.cfg.graceful_shutdown_timeout_s if self.cfg is not None else 20.0


class DeploymentState:
    """The replicas of one deployment, moved one tick at a time towards the target."""

    def __init__(
        self,
        name: str,
        launcher: Launcher,
        store: ReplicaStore,
        timeouts: Timeouts,
        gpus: GpuAllocator | None = None,
        cut_short: Callable[[], bool] = lambda: False,
    ) -> None:
        """``gpus``: the host's devices, shared by every deployment's replicas (none when not given). ``cut_short``:
        whether the scheduler is asked to stop, so that adding and starting a large deployment's replicas stops
        between two of them (what is left waits for the next scheduler, as recorded intent)."""
        self.name = name
        self._cut_short = cut_short
        self._launcher = launcher
        self._gpus = gpus if gpus is not None else GpuAllocator()
        self._store = store
        self._timeouts = timeouts
        self.replicas: dict[str, ReplicaWrapper] = {}
        # The same replicas filed by state (kept by each transition): a step walks only the replicas in its state.
        self._by_state: dict[ReplicaState, dict[str, ReplicaWrapper]] = {state: {} for state in ReplicaState}
        # Bumped whenever a replica comes, goes or changes state. Steps 6 and 9 depend on nothing else besides the
        # target, so each remembers the inputs under which it last found nothing to do, and skips a tick that has
        # the same: at 1,000 replicas a deployment, a settled farm's tick is then mostly step 2.
        self._generation = 0
        self._idle_roll: tuple[object, ...] | None = None
        self._settled: tuple[tuple[object, ...], bool] | None = None
        self._start_backoff = Backoff(FIRST_START_BACKOFF_S, MAX_START_BACKOFF_S)
        self._next_start_ms = 0
        self._last_failure = ""
        self.failed_starts = 0  # every replica that failed to start, ever (a goal judges those since it was written)
        # As of the last tick: whether a RUNNING replica does not yet run the target's user_config, and why one
        # whose reconfigure() refused it keeps the one before ("" when none did).
        self.user_config_behind = False
        self.user_config_refused = ""
        # Replicas this scheduler stopped (a rollout, a scale-down) that went: what they still held when their drain
        # ended is queued again uncharged, not as a dead replica's suspects (scheduler.py, _reclaim).
        self.retired: set[str] = set()
        self._waiting = ""  # why SHOULD_START replicas wait (e.g. for GPUs), "" when nothing holds them back
        # When and why a replica was last replaced for failing its check_health() (shown for REPLACED_NOTE_MS).
        self._replaced: tuple[int, str] = (0, "")
        # The last KEEPS_FAILING replicas replaced for their check_health(): when (ms), and which and why.
        self._health_replacements: collections.deque[tuple[int, str]] = collections.deque(maxlen=KEEPS_FAILING)
        # Once KEEPS_FAILING came within KEEPS_FAILING_MS: the verdict stands until that long after the last one
        # (a later replacement that leaves the window wider must not end it).
        self._keeps_failing = False
        # Why the target can never be met on this host as it is (more GPUs than it has), "" when it can.
        self.unschedulable = ""
        self._fits_none = False  # no replica fits this host's GPUs: UNHEALTHY, its callers get 503 at once
        self._health: DeploymentHealthRecord | None = None
        self._target_version: str | None = None
        self._autoscaler = AutoscalePolicy()
        self._last_load = NO_LOAD  # the previous tick's look at the queue (tells a request that came and went)
        # The replica count autoscaling decided; None while the deployment does not autoscale.
        self.autoscaled: int | None = None

    def restore_autoscaled(self, record: AutoscaleRecord) -> None:
        """Resume from the count an earlier scheduler decided (the delays start over)."""
        self.autoscaled = record.replicas

    def adopt(self, record: ReplicaRecord) -> None:
        """Take over a replica recorded by an earlier scheduler (it keeps running, with the GPUs it has)."""
        replica = ReplicaWrapper(record, self._launcher, self._store, self.name, self._refile)
        self.replicas[record.replica_id] = replica
        self._by_state[replica.state][record.replica_id] = replica
        self._generation += 1
        if replica.is_local:
            self._gpus.hold(record.replica_id, record.gpus)

    def _refile(self, replica: ReplicaWrapper, old: ReplicaState) -> None:
        rid = replica.record.replica_id
        del self._by_state[old][rid]
        self._by_state[replica.state][rid] = replica
        self._generation += 1

    def count(self, *states: ReplicaState) -> int:
        return sum(len(self._by_state[state]) for state in states)

    @property
    def is_gone(self) -> bool:
        return not self.replicas

    @property
    def runs_no_process(self) -> bool:
        """No replica the scheduler started is left (externally started workers are not ours to stop)."""
        return all(r.is_external for r in self.replicas.values())

    async def update(self, target: Target, beats: Beats, now_ms: int, load: Load = NO_LOAD) -> None:
        """One reconcile step; never blocks on a process. ``load``: the queue, as an autoscaled deployment's is read."""
        if target.version != self._target_version:  # a fresh start: earlier crash loops say nothing about it
            self._target_version = target.version
            self._reset_start_backoff()
            self._health_replacements.clear()  # nor the checks its replicas failed
            self._keeps_failing = False
        if target.cfg is not None:
            await self._observe_unrecorded(target, beats, now_ms)
        await self._observe_starting(beats, now_ms)
        await self._observe_running(target, beats, now_ms)
        await self._observe_stopping(beats, now_ms)
        await self._drop_stopped()
        target = await self._autoscale(target, load, now_ms)
        if target.count == 0 and not target.external:
            # Scaled to 0 (the way to quieten a broken deployment), by hand or by its autoscaler: it has nothing to
            # start, so nothing failing to. (Asked before autoscaling, an autoscaled one's count is its minimum: its
            # failed starts were forgotten at every tick, and it never turned UNHEALTHY.)
            self._reset_start_backoff()
        await self._scale_and_roll(target, now_ms)
        if self.consecutive_failures and not target.external and self.settled(target):
            # What kept failing to start is wanted no more (a scale-up scaled back): the deployment stayed UNHEALTHY
            # until a replica's start succeeded, which none had to.
            self._reset_start_backoff()
        await self._start_pending(target, now_ms)
        await self._stop_pending(target, now_ms)
        await self._record_health(target, now_ms)

    def _reset_start_backoff(self) -> None:
        self._start_backoff.reset()
        self._next_start_ms, self._last_failure = 0, ""

    # 0. A live replica with no record joins: an externally scaled deployment's replicas are whatever workers
    #    heartbeat; any other deployment's strays (started by hand, or left by a killed farm) are adopted as
    #    STARTING with no pid to act on, and step 6 keeps them if they are wanted or retires them. A retired
    #    stray reads SHOULD_STOP in its record and leaves by itself.
    async def _observe_unrecorded(self, target: Target, beats: Beats, now_ms: int) -> None:
        for replica_id in sorted(beats.said.keys() - self.replicas.keys()):  # a set difference: most are recorded
            beat = beats.said[replica_id]
            if not target.external and beat.health not in (ReplicaHealth.STARTING, ReplicaHealth.READY):
                continue  # a stray that failed or is leaving already: nothing to adopt
            if not _belongs_to(replica_id, self.name):
                logger.warning(
                    "deployment %s: ignoring a heartbeat under %r: not one of its replica ids", self.name, replica_id
                )
                continue
            if replica_id in beats.silent:
                # Died before we saw it live (or while no scheduler led): drop the beat, so its work is freed.
                await self._store.remove(self.name, replica_id)
                continue
            record = ReplicaRecord(
                replica_id=replica_id,
                state=ReplicaState.STARTING,
                version=beat.version,
                host=beat.host,
                pid=beat.pid if target.external else 0,  # a stray's pid is not one we may signal
                created_ms=now_ms,
                updated_ms=now_ms,
                external=target.external,
            )
            await self._store.save(self.name, record)
            how = "joined" if target.external else "found with no record; adopted"
            logger.info("replica %s: %s (host %s, pid %d)", replica_id, how, beat.host, beat.pid)
            self.adopt(record)

    # 1. STARTING replicas become RUNNING, or fail and are replaced with backoff.
    async def _observe_starting(self, beats: Beats, now_ms: int) -> None:
        for r in self._in(ReplicaState.STARTING):
            rid = r.record.replica_id
            beat = beats.said.get(rid)
            probe = r.check_started(beat, beats.last_beat_ms(rid), now_ms, self._timeouts)
            if probe is Started.READY:
                assert beat is not None
                version = beat.version if r.is_external else r.version  # what it loaded is what it runs
                await r.transition(ReplicaState.RUNNING, now_ms, version=version)
                self._start_backoff.reset()
                self._last_failure = ""
            elif probe is Started.FAILED:
                self._note_start_failure(r.failure, now_ms)
                r.force_kill()
                await r.transition(ReplicaState.STOPPED, now_ms, message=r.failure)
                await self._log(r, f"[streamserve: replica {r.id} failed to start: {r.failure}]")
            elif probe is Started.GONE:
                await r.transition(ReplicaState.STOPPED, now_ms, message="stopped before it was ready")

    # 2. RUNNING replicas whose process died or whose heartbeat expired are written off.
    async def _observe_running(self, target: Target, beats: Beats, now_ms: int) -> None:
        timeout_ms = self._timeouts.heartbeat_timeout_ms
        self.user_config_refused, self.user_config_behind = "", False
        for r in self._in(ReplicaState.RUNNING):
            rid = r.record.replica_id
            beat = beats.said.get(rid)
            if beat is not None and beat.user_config not in ("", target.user_config):  # ("": an older replica's)
                self.user_config_behind = True
                # (a deleted deployment's target has none: "" refuses nothing, and its replicas say nothing of it)
                if beat.refused_user_config and beat.refused_user_config == target.user_config:
                    self.user_config_refused = f"replica {rid}: {beat.message}"
            probe = r.check_alive(beat, beats.last_beat_ms(rid), now_ms, timeout_ms)
            if probe is Alive.DEAD:
                logger.warning("replica %s is dead: %s", r.id, r.failure)
                r.force_kill()  # a hung process must not come back and serve twice
                # (An externally scaled worker is its supervisor's to replace: the scheduler writes it off.)
                done = "wrote off dead worker" if r.is_external else "replaced dead replica"
                self._replaced = (now_ms, f"{done} {r.id}: {r.failure}")
                await r.transition(ReplicaState.STOPPED, now_ms, message=r.failure)
                await self._log(r, f"[streamserve: replica {r.id} is dead: {r.failure}]")
            elif probe is Alive.UNHEALTHY:
                # Replaced as Ray Serve does: stopped (it drains what it holds), and step 6 starts another.
                logger.warning("replica %s is unhealthy: %s; replacing it", r.id, r.failure)
                self._replaced = (now_ms, f"replaced unhealthy replica {r.id}: {r.failure}")
                self._note_health_replacement(now_ms, f"{r.id}: {r.failure}")
                await r.transition(ReplicaState.SHOULD_STOP, now_ms, message=f"{UNHEALTHY_STOP}{r.failure}")
            elif probe is Alive.DRAINING:
                await r.transition(ReplicaState.STOPPING, now_ms, message="draining: asked to stop")
            elif probe is Alive.GONE:
                await r.transition(ReplicaState.STOPPED, now_ms, message="exited")

    # 3. STOPPING replicas finish draining (or are killed at their deadline).
    async def _observe_stopping(self, beats: Beats, now_ms: int) -> None:
        for r in self._in(ReplicaState.STOPPING):
            last_beat_ms = beats.last_beat_ms(r.record.replica_id)
            stopped = r.check_stopped(last_beat_ms, now_ms, self._timeouts.heartbeat_timeout_ms)
            if stopped is not Stopped.DRAINING and not r.record.message.startswith(UNHEALTHY_STOP):
                self.retired.add(r.record.replica_id)  # (gone at its own drain limit, or killed at the deadline)
            if stopped is Stopped.GONE:
                await r.transition(ReplicaState.STOPPED, now_ms)

    # 4. STOPPED records are removed, with their heartbeats.
    async def _drop_stopped(self) -> None:
        for r in self._in(ReplicaState.STOPPED):
            r.forget_process()
            self._gpus.release(r.record.replica_id)
            await self._store.remove(self.name, r.record.replica_id)
            del self.replicas[r.record.replica_id], self._by_state[ReplicaState.STOPPED][r.record.replica_id]
            self._generation += 1

    # 5. An autoscaled deployment's count follows its queue; each decision is persisted before it is acted on.
    async def _autoscale(self, target: Target, load: Load, now_ms: int) -> Target:
        auto = target.cfg.autoscaling_config if target.cfg is not None else None
        if auto is None or target.shutting_down:
            if target.cfg is not None and auto is None and self.autoscaled is not None:
                logger.info("deployment %s: autoscaling off; %d replica(s) from now on", self.name, target.count)
                self.autoscaled, self._autoscaler, self._last_load = None, AutoscalePolicy(), NO_LOAD
                await self._store.save_autoscale(self.name, None)
            return target
        if self.autoscaled is None:
            # New, or autoscaling just turned on: start from what runs, so nothing is stopped or started for it.
            active = self.count(*ACTIVE_REPLICA_STATES)
            await self._set_autoscaled(auto.first_count(active), f"autoscaling on, {active} replica(s) running", now_ms)
        assert self.autoscaled is not None
        arrived, self._last_load = load.read_since(self._last_load), load
        decision = self._autoscaler.decide(auto, load.ongoing, self.autoscaled, now_ms, arrived)
        if decision is not None:
            await self._set_autoscaled(decision.replicas, decision.reason, now_ms)
        return replace(target, autoscaled=self.autoscaled)

    async def _set_autoscaled(self, replicas: int, reason: str, now_ms: int) -> None:
        old = "none" if self.autoscaled is None else str(self.autoscaled)
        await self._store.save_autoscale(
            self.name, AutoscaleRecord(replicas=replicas, reason=reason, updated_ms=now_ms)
        )
        self.autoscaled = replicas
        logger.info("deployment %s: autoscale %s -> %d (%s)", self.name, old, replicas, reason)

    # 6. Compare with the target: add replicas of the target version, retire extra and old ones (ours only).
    async def _scale_and_roll(self, target: Target, now_ms: int) -> None:
        inputs = (self._generation, target.version, target.count, self._waiting)
        if inputs == self._idle_roll:
            return
        await self._scale_and_roll_now(target, now_ms)
        self._idle_roll = inputs if self._generation == inputs[0] and not self._cut_short() else None

    async def _scale_and_roll_now(self, target: Target, now_ms: int) -> None:
        current: list[ReplicaWrapper] = []
        outdated: list[ReplicaWrapper] = []
        ready = 0  # RUNNING, of any version
        for state in _ACTIVE_IN_ORDER:  # one pass over ours (not externally started): 100,000 at scale
            running = state is ReplicaState.RUNNING
            for r in self._by_state[state].values():
                if not r.record.external:
                    (current if r.record.version == target.version else outdated).append(r)
                    ready += running

        missing = target.count - len(current)
        for _ in range(missing):
            if self._cut_short():
                return
            await self._add_replica(target, now_ms)
        # Too many of the current version: retire those that serve nothing first, then those holding the fewest
        # requests (a busy one stopped would have its requests cut at its deadline and run again), newest first.
        if missing < 0:
            serving = [r.record.replica_id for r in current if r.state is ReplicaState.RUNNING]
            held = await self._store.held(self.name, serving) if serving else {}
            current.sort(key=lambda r: _retire_order(r, held))
        for r in current[:-missing] if missing < 0 else ():
            ready -= r.state is ReplicaState.RUNNING
            await self._retire(r, now_ms)
        # Outdated replicas go as soon as the ready count stays at or above the target without them; or, while
        # new ones wait for GPUs the old ones hold, one at a time (nothing else would free them). One that holds no
        # GPU, or when the new version fits none of the host's GPUs, serves on: stopping it would free nothing.
        starting = any(r.state is ReplicaState.STARTING for r in current)
        frees_gpus = bool(self._waiting) and not starting and not self._fits_none
        for r in sorted(outdated, key=_retire_order):
            if r.state is not ReplicaState.RUNNING:
                await self._retire(r, now_ms)
            elif ready - 1 >= target.count or (frees_gpus and self._gpus.holds(r.record.replica_id)):
                ready -= 1
                starting = True  # one at a time: wait for its replacement before the next
                await self._retire(r, now_ms)

    @staticmethod
    async def _retire(r: ReplicaWrapper, now_ms: int) -> None:
        """A replica with a process is stopped gracefully; one never started is simply dropped."""
        new = ReplicaState.STOPPED if r.state is ReplicaState.SHOULD_START else ReplicaState.SHOULD_STOP
        await r.transition(new, now_ms)

    async def _add_replica(self, target: Target, now_ms: int) -> None:
        assert target.version is not None
        replica_id = ReplicaID.new(self.name)
        record = ReplicaRecord(
            replica_id=replica_id.to_str(),
            state=ReplicaState.SHOULD_START,
            version=target.version,
            created_ms=now_ms,
            updated_ms=now_ms,
        )
        await self._store.save(self.name, record)  # persist the intent before acting on it
        logger.info("replica %s: created (SHOULD_START, version %s)", replica_id, target.version)
        self.adopt(record)

    # 7. SHOULD_START replicas are spawned with the GPUs they ask for, unless a crash loop asks us to back off.
    async def _start_pending(self, target: Target, now_ms: int) -> None:
        pending = self._in(ReplicaState.SHOULD_START)
        need = target.cfg.resources.gpus if target.cfg is not None else 0
        devices = len(self._gpus.devices)
        self._waiting, self.unschedulable, self._fits_none = "", "", False
        if need and target.count * need > devices:
            self.unschedulable = (
                f"{target.count} replica(s) x {need} GPU(s) do not fit the {devices} GPU(s) of this host"
            )
            self._fits_none = need > devices  # not even one: nothing will ever serve it here
        if not pending or now_ms < self._next_start_ms:
            return
        for r in pending:
            if self._cut_short():
                return
            gpus = self._gpus.take(r.record.replica_id, need) if need else ()
            if gpus is None:  # never started without its GPUs: it waits for some to be freed
                self._waiting = self._gpus.shortage(need)
                await r.wait(now_ms, self._waiting)
                continue
            try:
                await r.start(now_ms, gpus)
            except OSError as exc:
                self._gpus.release(r.record.replica_id)
                self._note_start_failure(f"cannot start process: {exc}", now_ms)
                await r.transition(ReplicaState.STOPPED, now_ms, message=str(exc))

    # 8. SHOULD_STOP replicas get SIGTERM and a deadline.
    async def _stop_pending(self, target: Target, now_ms: int) -> None:
        for r in self._in(ReplicaState.SHOULD_STOP):
            await r.stop(now_ms, target.graceful_shutdown_timeout_s + 1.0)

    # 9. The verdict, written only when it changes.
    async def _record_health(self, target: Target, now_ms: int) -> None:
        running = self.count(ReplicaState.RUNNING)
        failed_alone = self.failed_alone(target)
        if self.unhealthy or self._fits_none:
            health, message = DeploymentHealth.UNHEALTHY, self._last_failure or self.unschedulable
        elif keeps_failing := self._keeps_failing_checks(now_ms):
            health, message = DeploymentHealth.UNHEALTHY, keeps_failing
        elif self.user_config_refused:  # it serves, but not with the config asked for
            health, message = DeploymentHealth.UNHEALTHY, self.user_config_refused
        elif self.settled(target) and not failed_alone:
            health, message = DeploymentHealth.HEALTHY, self._recent_replacement(now_ms)
        else:
            health, message = DeploymentHealth.UPDATING, self._last_failure or self._waiting
            message = message or self._recent_replacement(now_ms)
        verdict = (health, message, running)
        if self._health is None or (self._health.health, self._health.message, self._health.running) != verdict:
            self._health = DeploymentHealthRecord(
                health=health,
                message=message,
                consecutive_failures=self.consecutive_failures,
                running=running,
                updated_ms=now_ms,
            )
            await self._store.save_health(self.name, self._health)
            if not target.shutting_down:  # (stopping with the scheduler, its replicas going is no news)
                logger.info("deployment %s: %s%s", self.name, health.value, f" ({message})" if message else "")

    def failed_alone(self, target: Target) -> bool:
        """An externally scaled deployment none of whose workers runs, the last of them failed to start: not settled
        either, though it has as many as it wants (whatever heartbeats); its failure is news."""
        return target.external and not self.count(ReplicaState.RUNNING) and bool(self._last_failure)

    @property
    def unhealthy(self) -> bool:
        """Replicas of the target version keep failing to start."""
        return self.consecutive_failures >= UNHEALTHY_AFTER_FAILURES

    @property
    def consecutive_failures(self) -> int:
        """Failed starts in a row (of the target version, since the last replica that came up)."""
        return self._start_backoff.failures

    @property
    def last_failure(self) -> str:
        return self._last_failure

    def settled(self, target: Target) -> bool:
        """Exactly the target number of replicas, all RUNNING the target version, and nothing else.

        Externally scaled: every live replica is a worker RUNNING the target version, however many there are.
        """
        inputs = (self._generation, target.version, target.count, target.external)
        if self._settled is None or self._settled[0] != inputs:
            running = self._by_state[ReplicaState.RUNNING].values()
            count = len(running) if target.external else target.count
            self._settled = (
                inputs,
                len(running) == len(self.replicas) == count
                and all(r.record.version == target.version and r.record.external == target.external for r in running),
            )
        return self._settled[1]

    def _note_start_failure(self, reason: str, now_ms: int) -> None:
        self._last_failure = reason
        self.failed_starts += 1
        backoff_s = self._start_backoff.next()
        self._next_start_ms = now_ms + int(backoff_s * 1000)
        logger.warning(
            "deployment %s: replica failed to start (%s); %d in a row, next start in %.1fs",
            self.name,
            reason,
            self.consecutive_failures,
            backoff_s,
        )

    def _note_health_replacement(self, now_ms: int, why: str) -> None:
        replaced = self._health_replacements
        replaced.append((now_ms, why))
        if len(replaced) == KEEPS_FAILING and now_ms - replaced[0][0] <= KEEPS_FAILING_MS:
            self._keeps_failing = True

    def _keeps_failing_checks(self, now_ms: int) -> str:
        """Why its replicas keep failing their check_health(), once KEEPS_FAILING were replaced for it within
        KEEPS_FAILING_MS, until that long has passed with none replaced ("" otherwise)."""
        if not self._keeps_failing:
            return ""
        last, why = self._health_replacements[-1]
        if now_ms - last > KEEPS_FAILING_MS:
            self._keeps_failing = False
            return ""
        return (
            f"its replicas keep failing their check_health(): {KEEPS_FAILING} replaced within "
            f"{KEEPS_FAILING_MS / 1000:g} s; last {why}"
        )

    def _recent_replacement(self, now_ms: int) -> str:
        """Why a replica was replaced for its health, while that is recent ("" otherwise)."""
        when, why = self._replaced
        return why if why and now_ms - when < REPLACED_NOTE_MS else ""

    async def _log(self, replica: ReplicaWrapper, line: str) -> None:
        """Add ``line`` to the deployment's logs as ``replica``'s, once its record says what happened (a write Redis
        refuses is not tried again: the record is what counts)."""
        try:
            await self._store.log_line(self.name, replica.record, line)
        except Exception as exc:
            logger.warning("deployment %s: could not add to its logs: %s", self.name, exc)

    def _in(self, state: ReplicaState) -> list[ReplicaWrapper]:
        """The replicas in ``state`` (a copy: a step may move them on as it goes)."""
        return list(self._by_state[state].values())


def _belongs_to(replica_id: str, deployment: str) -> bool:
    try:
        return ReplicaID.from_str(replica_id).deployment == deployment
    except ProtocolError:
        return False


def _retire_order(r: ReplicaWrapper, held: Mapping[str, int] | None = None) -> tuple[int, int, int]:
    """Replicas that serve nothing yet go first, then those holding the fewest requests (``held``, by replica id;
    none when not given), then the youngest."""
    serving = r.state is ReplicaState.RUNNING
    return (int(serving), held.get(r.record.replica_id, 0) if held else 0, -r.record.created_ms)
