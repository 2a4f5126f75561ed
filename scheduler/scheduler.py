"""The scheduler process: lead (or stand by), then reconcile every deployment on each tick.

A Redis that is out of memory refuses the tick's writes (a replica's new state, a goal, a sample): the scheduler
says so once, keeps reading and acting on what it can, and tries the refused writes again on later ticks. The
replicas' heartbeats are refused as well, so, as after an outage, their silence counts only from when Redis takes
writes again (the leader lock's renewal tells, every tick). A scheduler cannot take a free leader lock then (that
is a write too): it stands by until Redis has room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Mapping

import redis.asyncio as aioredis

from streamserve.client.jobs import jobs_redis_url
from streamserve.control.desired_state import DesiredState
from streamserve.control.resources import GpuAllocator, host_gpus, host_memory_bytes, overcommit
from streamserve.metrics.history import MetricsHistory
from streamserve.runtime.lifeline import FARM_GONE_DRAIN_S, FARM_GONE_WIND_DOWN_S, inherited, is_cut
from streamserve.runtime.settings import Settings
from streamserve.scheduler.autoscaler import NO_LOAD, Load
from streamserve.scheduler.deployment_state import DeploymentState, Target
from streamserve.scheduler.goals import GoalTracker
from streamserve.scheduler.heartbeat_reader import Beats, HeartbeatReader
from streamserve.scheduler.job_pool import JobWorkerPool
from streamserve.scheduler.key_migration import migrate_farm_keys
from streamserve.scheduler.leader import LeaderLock
from streamserve.scheduler.left_requests import answer_left_requests
from streamserve.scheduler.reclaim import Reclaimer
from streamserve.scheduler.store import RedisReplicaStore
from streamserve.scheduler.types import Clock, Launcher, Timeouts
from streamserve.transport.connections import (
    RETRYABLE_ERRORS,
    OutageLog,
    WriteRefusals,
    async_redis,
    connection_hint,
    stop_retrying,
)
from streamserve.transport.model_streams import ModelStreams, RoutedBacklog
from streamserve.transport.streams import ensure_groups
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import ConfigError
from streamserve.wire.messages import now_ms

logger = logging.getLogger(__name__)

# How long job workers may take to finish their jobs on shutdown when no deployment says (a Redis outage).
JOB_WORKERS_STOP_S = DeploymentConfig.model_fields["graceful_shutdown_timeout_s"].default
# A deployment's consumers are listed at least this often even when no replica of ours was written off.
FULL_RECLAIM_EVERY_MS = 5_000


class Scheduler:
    """Owns the reconcile loop; ``should_exit`` asks for a graceful stop."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        launcher: Launcher,
        *,
        stop_replicas_on_exit: bool = False,
        job_pool: JobWorkerPool | None = None,
        clock: Clock = now_ms,
    ) -> None:
        self._settings = settings
        self._redis = redis
        self._keys = settings.keys
        self._launcher = launcher
        self._clock = clock
        self._store = RedisReplicaStore(redis, self._keys)
        self._desired = DesiredState(redis, self._keys)
        self._timeouts = Timeouts(
            heartbeat_timeout_ms=int(settings.heartbeat_timeout_s * 1000),
            start_timeout_ms=int(settings.start_timeout_s * 1000),
        )
        self._heartbeats = HeartbeatReader(redis, self._keys, self._timeouts.heartbeat_timeout_ms)
        self._lock = LeaderLock(redis, self._keys)
        self._reclaimer = Reclaimer(redis, self._keys)
        self._model_streams = ModelStreams(redis, self._keys)
        self._goals = GoalTracker(redis, self._keys)
        self._history = MetricsHistory(redis, self._keys)
        self._stop_replicas_on_exit = stop_replicas_on_exit
        # Set by _shutdown once the job workers are gone: only then may a tick stop the replicas, never because the
        # exit signal came in the middle of a tick (a job worker's call still queued would find no replica).
        self._stopping_replicas = False
        self._job_pool = job_pool
        self._states: dict[str, DeploymentState] = {}
        self._gpus = GpuAllocator(host_gpus(settings.gpus))
        self._overcommitted: list[str] = []  # the last warning given about CPUs and memory, so it is given once
        self._known_groups: set[str] = set()
        # Per deployment: the live consumers at its last reclaim, and when the next is due regardless (see _reclaim).
        self._reclaimed: dict[str, tuple[set[str], int]] = {}
        self._standing_by = False
        # Set when Redis was away or refused writes for memory; the next tick counts replicas' silence from then (they
        # could not beat either).
        self._redis_was_away = False
        self._silence_from_ms = 0
        # When the last tick read the heartbeats (this clock's ms; 0: none yet), to tell a stall between two reads.
        self._last_read_ms = 0
        self._memory = WriteRefusals(logger, f"scheduler {self._lock.holder_id}")
        self._outage = OutageLog(logger, f"scheduler {self._lock.holder_id}")
        self.should_exit = asyncio.Event()
        self.ticks = 0

    async def run(self) -> None:
        """Lead when possible, tick until asked to exit, then shut down."""
        logger.info("scheduler %s: starting", self._lock.holder_id)
        try:
            while not self.should_exit.is_set():
                try:
                    await self._lead_or_wait()
                    self._outage.answered()
                except RETRYABLE_ERRORS as exc:
                    self._outage.lost(exc, connection_hint(self._settings.effective_redis_url, exc))
                    self._redis_was_away = True
                    self._last_read_ms = 0  # (said above: not a stall as well)
                except Exception as exc:
                    if not self._memory.refused(exc):
                        raise
                await self._sleep(self._settings.tick_interval_s)
            await self._shutdown()
        finally:
            logger.info("scheduler %s: exited after %d ticks", self._lock.holder_id, self.ticks)

    async def _lead_or_wait(self) -> None:
        was_leader = self._lock.held
        if not await self._take_the_lead():
            if was_leader:
                logger.warning("scheduler %s: lost leadership; standing by", self._lock.holder_id)
                self._states.clear()
            elif not self._standing_by:
                leader = await self._lock.current_leader()
                if leader is None:  # free, and Redis would not let us take it
                    logger.info(
                        "scheduler %s: standing by until Redis has room for the leader lock", self._lock.holder_id
                    )
                else:
                    # (it may have just died: a lock is not a pulse)
                    logger.info(
                        "scheduler %s: standing by while scheduler %s holds the leader lock (taking over within %gs"
                        " of its last renewal, should it be gone)",
                        self._lock.holder_id,
                        leader,
                        self._lock.ttl_s,
                    )
            self._standing_by = True
            self._last_read_ms = 0  # (a scheduler that takes the lead later has not stalled meanwhile)
            if self._job_pool is not None:
                self._job_pool.stop()  # only the leader runs job workers: the pool's size is the farm's
            return
        self._standing_by = False
        if self._lock.writes_refused is not None:
            self._memory.refused(self._lock.writes_refused)
            self._redis_was_away = True
        else:
            self._memory.accepted()
        if not was_leader:
            logger.info("scheduler %s: leading", self._lock.holder_id)
            await self._adopt()
        await self.tick()
        if self._job_pool is not None:
            await self._job_pool.keep_running()

    async def _take_the_lead(self) -> bool:
        """Take or keep the leader lock; whether we lead. A Redis out of memory refuses a lock that is free: no."""
        try:
            return await self._lock.acquire_or_renew()
        except Exception as exc:
            if not self._memory.refused(exc):
                raise
            return False

    async def _adopt(self, say: bool = True) -> None:
        """Take over whatever replicas Redis records, instead of starting duplicates, and the autoscaled counts
        (``say``: log what was taken over; not when read again to stop them all)."""
        self._states.clear()
        await migrate_farm_keys(self._redis, self._keys)
        self._gpus = GpuAllocator(self._gpus.devices)  # the adopted records say who holds which device
        if say and self._gpus.devices:
            logger.info("scheduler: GPUs on this host: %s", ", ".join(self._gpus.devices))
        for name, records in (await self._store.load_all()).items():
            state = self._state(name)
            for record in records:
                state.adopt(record)
            if say:
                logger.info("scheduler: adopted %d replica(s) of %s", len(records), name)
        for name, autoscaled in (await self._store.load_autoscale()).items():
            self._state(name).restore_autoscaled(autoscaled)
            if say:
                logger.info("scheduler: %s resumes autoscaling at %d replica(s)", name, autoscaled.replicas)

    def _state(self, name: str) -> DeploymentState:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = DeploymentState(
                name, self._launcher, self._store, self._timeouts, self._gpus, self._cut_short
            )
        return state

    def _cut_short(self) -> bool:
        """Asked to stop, and not stopping the replicas: the rest of a tick waits for the next scheduler."""
        return self.should_exit.is_set() and not self._stopping_replicas

    async def tick(self) -> None:
        """One reconcile pass over every deployment, desired or still winding down."""
        self.ticks += 1
        goals = await self._goals.load()  # before the desired state: see GoalTracker.load
        desired = await self._desired.deployments()
        self._warn_if_overcommitted(desired)
        names = sorted(set(desired) | set(self._states))
        now = self._clock()
        if self._stalled_since_last_read(now):
            self._redis_was_away = True
        if self._redis_was_away:
            self._redis_was_away, self._silence_from_ms = False, now
        self._last_read_ms = now
        beats = await self._heartbeats.read(names, now, self._silence_from_ms)
        autoscaled = [name for name, cfg in desired.items() if cfg.autoscaling_config is not None]
        ongoing = await self._store.ongoing(autoscaled) if autoscaled else {}
        for name, backlog in (await self._sweep_models(sorted(desired))).items():
            if name in ongoing:
                ongoing[name] = ongoing[name].plus(backlog.length, backlog.last_read)
        for name in names:
            if self._cut_short():
                # Asked to stop: the rest waits for the next scheduler (or, stopping replicas, the ticks of
                # _shutdown), rather than holding off the stop for as long as a large farm's tick takes.
                logger.info("scheduler: tick %d cut short to stop", self.ticks)
                return
            try:
                await self._reconcile(name, desired.get(name), beats[name], ongoing.get(name, NO_LOAD), now)
            except RETRYABLE_ERRORS:
                raise
            except Exception as exc:
                # One deployment's surprise must not stop the others from being reconciled.
                if not self._memory.refused(exc):
                    logger.exception("deployment %s: reconcile step failed; retrying next tick", name)
        try:
            await self._goals.update(goals, desired, self._states, now)
            await self._history.maybe_sample(sorted(desired), now)
        except RETRYABLE_ERRORS:
            raise
        except Exception as exc:
            if not self._memory.refused(exc):
                raise

    def _stalled_since_last_read(self, now: int) -> bool:
        """Whether the heartbeats were last read long enough ago (half a heartbeat timeout, where ticks come every
        tick_interval_s) that a stall is the likely cause: a Redis that hung (a slow command, a fork or fsync stall,
        a paused VM) held every replica's beat as it held this scheduler's reads, and its silence since is no sign of
        death; it counts from now, as after an outage (or this process stalled: a dead replica is found one timeout
        later). Without it, a Redis paused for a timeout had every replica of the farm killed, and their requests
        run again."""
        gap_ms = now - self._last_read_ms
        if not self._last_read_ms or gap_ms < self._timeouts.heartbeat_timeout_ms // 2:
            return False
        logger.warning(
            "scheduler: %.1fs since it last read the heartbeats (Redis or this process stalled): replicas' silence "
            "counts from now",
            gap_ms / 1000,
        )
        return True

    async def _reconcile(self, name: str, cfg: DeploymentConfig | None, beats: Beats, ongoing: Load, now: int) -> None:
        shutting_down = self._stopping_replicas
        if cfg is not None:
            await self._ensure_group_once(cfg)
        state = self._state(name)
        await state.update(Target(cfg, shutting_down), beats, now, ongoing)
        if cfg is not None:
            await self._reclaim(cfg, set(state.replicas) | beats.heard(), now, state.retired)
        if cfg is None and state.is_gone:
            told = await answer_left_requests(self._redis, self._keys, name)
            if told:
                logger.info("deployment %s: told the callers of %d request(s) it never ran that it is gone", name, told)
            await self._store.forget_deployment(name)
            await self._forget_jobs(name)
            self._known_groups.discard(name)
            self._reclaimed.pop(name, None)
            del self._states[name]
            logger.info("deployment %s: deleted", name)

    def _warn_if_overcommitted(self, desired: Mapping[str, DeploymentConfig]) -> None:
        problems = overcommit(desired.values(), os.cpu_count() or 1, host_memory_bytes())
        if problems != self._overcommitted:
            for problem in problems:
                logger.warning("scheduler: %s (the replicas may run short, or be killed for memory)", problem)
            self._overcommitted = problems

    async def _sweep_models(self, names: list[str]) -> dict[str, RoutedBacklog]:
        """Give back the queues routed to replicas that are gone (a holder died: wire/models.py), and keep KEDA's
        count of the routed streams' entries; every tick, for the deployments that have any."""
        swept = {}
        for name in await self._store.with_models(names) if names else []:
            try:
                swept[name] = backlog = await self._model_streams.sweep(name)
            except RETRYABLE_ERRORS:
                raise
            except Exception as exc:
                if not self._memory.refused(exc):
                    logger.exception("deployment %s: looking after its routed streams failed", name)
                continue
            if backlog.given_back:
                logger.warning(
                    "deployment %s: %d request(s) routed to replicas that are gone went back to its queue",
                    name,
                    backlog.given_back,
                )
        return swept

    async def _forget_jobs(self, deployment: str) -> None:
        """A deleted deployment's job idempotency keys, in the jobs' Redis (a Redis Cluster without one has no jobs)."""
        try:
            url = jobs_redis_url(self._settings)
        except ConfigError:
            return
        if url == self._settings.effective_redis_url:
            await self._store.forget_jobs(self._redis, deployment)
            return
        jobs = async_redis(url)
        try:
            await self._store.forget_jobs(jobs, deployment)
        finally:
            await jobs.aclose()

    async def _reclaim(self, cfg: DeploymentConfig, live: set[str], now: int, retired: set[str]) -> None:
        """Free what dead consumers hold: at once when the live set changed (a replica was written off), and every
        FULL_RECLAIM_EVERY_MS in any case (a consumer no replica of ours answers for, left by an earlier farm).

        Listing a group's consumers is the one per-replica read of a tick; at 1,000 replicas a deployment, doing it
        every tick cost more than the rest of the tick.
        """
        last = self._reclaimed.get(cfg.name)
        if last is not None and last[0] == live and now < last[1]:
            return
        await self._reclaimer.reclaim(cfg, live, retired)
        retired.intersection_update(live)  # freed (those still live are freed once gone)
        # Spread over the interval, so that the deployments' full listings do not all land on one tick.
        self._reclaimed[cfg.name] = (live, now + int(FULL_RECLAIM_EVERY_MS * random.uniform(0.5, 1.0)))

    async def _ensure_group_once(self, cfg: DeploymentConfig) -> None:
        """Create the consumer groups at id 0 so requests queued before any replica are still served."""
        if cfg.name in self._known_groups:
            return
        await ensure_groups(self._redis, self._keys, cfg.name)
        self._known_groups.add(cfg.name)

    async def _shutdown(self) -> None:
        farm_gone = self._farm_gone()
        await self._stop_job_workers(farm_gone)  # first, so that the jobs they run still find live replicas
        if self._lock.held and self._stop_replicas_on_exit and not farm_gone:
            logger.info("scheduler: stopping all replicas before exit")
            self._stopping_replicas = True
            try:
                await self._adopt(say=False)
                while not all(s.runs_no_process for s in self._states.values()):
                    await self._take_the_lead()
                    await self.tick()
                    await asyncio.sleep(self._settings.tick_interval_s)
            except RETRYABLE_ERRORS as exc:
                logger.warning("scheduler: Redis lost while stopping replicas: %s", exc)
        with contextlib.suppress(*RETRYABLE_ERRORS):
            await self._lock.release()

    def _farm_gone(self) -> bool:
        """Whether the `streamserve up` that started this scheduler died (its lifeline is cut): then nobody will
        restart its Redis, most likely gone with it, and its replicas and job workers leave by themselves, briefly.
        Its way out tries each write once."""
        lifeline = inherited(self._settings.lifeline_fd)
        if lifeline is None or not is_cut(lifeline):
            return False
        logger.warning("scheduler: the `streamserve up` that started it is gone; replicas and job workers leave too")
        stop_retrying()
        return True

    def stop_taking_jobs(self) -> None:
        """Told (STOP_JOBS_SIGNAL, by `up` as it begins to stop) that no job is to start any more."""
        if self._job_pool is not None:
            self._job_pool.stop_taking_jobs()

    async def _stop_job_workers(self, farm_gone: bool) -> None:
        """Let job workers finish their calls for as long as the deployments they call may drain, then kill them
        (when the farm is gone, for as long as they give themselves: job_worker.JobWorker.farm_gone)."""
        if self._job_pool is None:
            return
        self._job_pool.stop()
        try:
            if farm_gone:
                drain_s = FARM_GONE_DRAIN_S + FARM_GONE_WIND_DOWN_S
            else:
                desired = await self._desired.deployments()
                drain_s = max((c.graceful_shutdown_timeout_s for c in desired.values()), default=JOB_WORKERS_STOP_S)
        except RETRYABLE_ERRORS:
            drain_s = JOB_WORKERS_STOP_S
        deadline = asyncio.get_running_loop().time() + drain_s
        while self._job_pool.pids and asyncio.get_running_loop().time() < deadline:
            if self._lock.held:
                with contextlib.suppress(*RETRYABLE_ERRORS):
                    await self._take_the_lead()
            await asyncio.sleep(0.1)
        await self._job_pool.kill()
        self._job_pool.close()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.should_exit.wait(), timeout=seconds)
