"""One replica's process lifecycle: load (import + constructor) -> serve -> drain on SIGTERM -> exit.

The replica reports each step in its heartbeat (workers/heartbeat_loop.py); the
scheduler turns those reports into lifecycle transitions. What serves is
built only once the deployment has loaded (workers/serving.py); when a worker
the scheduler does not own leaves by itself is workers/departure.py's to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from streamserve import multiplexing
from streamserve.client.handles import close_handles, serve_handles_on
from streamserve.control.desired_state import DesiredState
from streamserve.control.heartbeats import queue_removal
from streamserve.control.long_poll import LongPollSubscriber
from streamserve.metrics.figures import Figures
from streamserve.metrics.flusher import MetricsFlusher
from streamserve.runtime.lifeline import FARM_GONE_WIND_DOWN_S
from streamserve.runtime.processes import end_own_group
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RETRYABLE_ERRORS, RedisRefusals, redacted, stop_retrying
from streamserve.transport.model_streams import ModelStreams
from streamserve.transport.pipelining import BlockingReader, Pipeliner
from streamserve.transport.streams import ensure_groups
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import NotFoundError, StreamServeError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.keys import CONSUMER_GROUP, ConfigKey
from streamserve.wire.messages import now_ms
from streamserve.wire.states import ReplicaHealth
from streamserve.workers.contained import exception_text, what_was_raised
from streamserve.workers.control_reader import ControlReader
from streamserve.workers.departure import Departure, DepartureRules
from streamserve.workers.health_checks import watch_health
from streamserve.workers.heartbeat_loop import ReplicaHeartbeat
from streamserve.workers.loader import load
from streamserve.workers.model_holder import ModelHolder
from streamserve.workers.serving import Serving
from streamserve.workers.slots import Slots
from streamserve.workers.threads import HandlerThreads

logger = logging.getLogger(__name__)

# How long each step of a replica's exit after its drain may take (closing subscriptions, last writes to Redis).
WIND_DOWN_STEP_S = 10.0


class Replica:
    """Serves one deployment until asked to stop."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        replica_id: ReplicaID,
        after_load: Callable[[], None] | None = None,
        pinned_version: str | None = None,
        takes_over: str | None = None,
    ) -> None:
        """``after_load`` runs once the deployment is loaded, before serving (the process freezes its heap).

        ``pinned_version``: serve only while the deployment is at this version (its ``version`` field or its
        code version); refuse to start otherwise, and drain and exit non-zero once it moves on.
        ``takes_over``: the replica id of the worker this process was before it started again on new code;
        its last heartbeat is replaced by this one's first, so the scheduler never sees the worker missing.
        """
        self._settings = settings
        self._after_load = after_load
        self._redis = redis
        self._desired = DesiredState(redis, settings.keys)
        self._pipeliner = Pipeliner(redis)
        self._reader = BlockingReader(redis)
        self._keys = settings.keys
        self.replica_id = replica_id
        self._consumer = replica_id.to_str()
        self._name = replica_id.deployment
        self._rules = DepartureRules(self._name, pinned_version)
        self._slots = Slots()
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._drain_limit_s = math.inf  # shortened when the farm is gone: nobody is left to answer
        self._farm_gone = False  # its `up` died: after the drain, its exit is brief (_wind_down)
        self._loading = False  # its deployment's code is being imported and constructed
        self._wind_down_until = math.inf  # the loop time by which its exit's steps end (set after a farm-gone drain)
        # Set when an externally started worker should run again as a new process on the deployment's new code.
        self.restart_reason = ""
        self._figures = Figures() if settings.metrics else None
        # The deployment's config as last read, None until loading reads it; the serving half is given each one.
        self._config: DeploymentConfig | None = None
        self._heartbeat = ReplicaHeartbeat(
            settings, redis, replica_id, self._slots, self._leave, self._stopping.is_set, takes_over
        )

    # -- stopping --------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether it has stopped reading new requests (asked to, or leaving by itself)."""
        return self._stopping.is_set()

    @property
    def loading(self) -> bool:
        """Whether its deployment's code is being imported and constructed (it holds no request yet)."""
        return self._loading

    def request_stop(self) -> None:
        """Stop reading new requests and drain (safe to call from a signal handler)."""
        if not self._stopping.is_set():
            logger.info("replica %s: stop requested, draining %d in flight", self.replica_id, self._slots.held)
        self._stopping.set()
        self._slots.wake()

    def _leave(self, departure: Departure) -> None:
        logger.warning("replica %s: %s", self.replica_id, departure.why)
        if departure.restart_reason:
            self.restart_reason = departure.restart_reason
        self._drain_limit_s = min(self._drain_limit_s, departure.drain_limit_s)
        if departure.farm_gone:
            if self._loading:
                # Its constructor runs on a thread nothing can stop (a hung one would keep it for ever), and nobody
                # is left to kill it: it goes now, with what its code started so far.
                end_own_group()
                os._exit(departure.exit_code)
            # Nobody is left to restart it or its Redis: every write from here on (the drain's replies, heartbeats,
            # the last writes) is tried once, and the exit's steps all end within FARM_GONE_WIND_DOWN_S.
            stop_retrying()
            self._farm_gone = True
        self._exit_code = departure.exit_code
        self.request_stop()

    @property
    def farm_gone(self) -> bool:
        """Whether it leaves because its `streamserve up` died: then no scheduler will end what it leaves behind."""
        return self._farm_gone

    # -- the lifecycle ---------------------------------------------------------

    async def run(self) -> int:
        """Load, serve until stopped, drain; return the process exit code.

        A worker whose deployment does not exist, or is not at its pinned
        version, exits 1 before it heartbeats: it never serves.
        """
        refusal = await self._refusal()
        if refusal:
            logger.error("replica %s: %s", self.replica_id, refusal)
            return 1
        heartbeat = asyncio.create_task(self._heartbeat.run(), name="heartbeat")
        metrics = MetricsFlusher(self._redis, self._keys, self._figures) if self._figures is not None else None
        if metrics is not None:
            metrics.start()
        longpoll: LongPollSubscriber | None = None
        serving: Serving | None = None
        holding: asyncio.Task[None] | None = None
        control: ControlReader | None = None
        serve_handles_on(asyncio.get_running_loop(), self._settings)  # where its handlers' handles call from
        try:
            self._loading = True
            try:
                serving = await self._load()
            finally:
                self._loading = False
            if serving is None:
                return 1  # the FAILED heartbeat stays: it tells the scheduler why
            await ensure_groups(self._redis, self._keys, self._name)
            holding = await self._hold_models(serving)
            # What callers say about the requests it serves (how far they have read a stream, that they cancel one);
            # read until it exits.
            control_key = self._keys.replica_control(self._name, self._consumer)
            control = ControlReader(self._redis, control_key, serving.control_handlers, self._consumer)
            await control.start()
            longpoll = LongPollSubscriber(
                self._redis, self._keys, lambda k: k == ConfigKey.DEPLOYMENTS, functools.partial(self._follow, serving)
            )
            await longpoll.start()
            await self._heartbeat.set_health(ReplicaHealth.READY)
            logger.info("replica %s: ready (pid %d)", self.replica_id, os.getpid())
            health = self._watch_health(serving)
            try:
                await serving.serve()
            finally:
                if health is not None:
                    health.cancel()
                await self._reader.aclose()
            await self._drain(serving)
            return self._exit_code
        finally:
            if self._farm_gone:
                self._wind_down_until = asyncio.get_running_loop().time() + FARM_GONE_WIND_DOWN_S
            if longpoll is not None:
                await self._wind_down("the config subscription", longpoll.close())
            if holding is not None:
                holding.cancel()
                multiplexing.listen(None)
            self._heartbeat.stop()
            heartbeat.cancel()
            await self._wind_down("the heartbeat", heartbeat)
            if serving is not None:
                await self._wind_down("the batches", serving.close_batches())
                serving.close_streams()
                serving.close_threads()
            await self._wind_down("the handles' client", close_handles())
            if control is not None:
                await self._wind_down("the control stream", control.aclose())
            await self._wind_down("the replies", self._pipeliner.aclose())
            if metrics is not None:
                await self._wind_down("the last metrics", metrics.aclose())
            if serving is not None:
                await self._wind_down("the goodbye", self._goodbye(serving))
            served, failed = (serving.served, serving.failed) if serving is not None else (0, 0)
            logger.info("replica %s: exited after %d requests (%d failed)", self.replica_id, served, failed)

    async def _wind_down(self, what: str, step: Awaitable[object]) -> None:
        """One step of the exit, bounded: a replica that drained must exit, even if a step hangs (it is named)."""
        limit_s = max(0.0, min(WIND_DOWN_STEP_S, self._wind_down_until - asyncio.get_running_loop().time()))
        try:
            async with asyncio.timeout(limit_s):
                await step
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the exit itself was cancelled (a cancelled step, such as the heartbeat task, is not)
        except TimeoutError:
            logger.warning("replica %s: %s did not finish within %.3gs; exiting anyway", self.replica_id, what, limit_s)
        except Exception as exc:  # e.g. Redis gone for good: the exit goes on
            logger.warning(
                "replica %s: %s failed on the way out: %s: %s", self.replica_id, what, type(exc).__name__, exc
            )

    async def _refusal(self) -> str:
        """Why this worker must not start ("" when it may)."""
        url = self._settings.effective_redis_url
        try:
            cfg = await self._desired.get(self._name)
        except NotFoundError:
            return (
                f"no deployment named {self._name!r} in Redis at {redacted(url)}; deploy it first "
                "(streamserve deploy CONFIG)"
            )
        except RETRYABLE_ERRORS as exc:
            return str(RedisRefusals(url).meaning(exc))  # (with the other roles' hints: a password missing, say)
        return self._rules.refusal(cfg) or await self._id_in_use()

    async def _id_in_use(self) -> str:
        """Why this replica's id is another live process's ("" when it is not): `worker --replica-id` given the id
        `status` shows for a running replica. Both would serve under one name, and when either stopped, its leaving
        heartbeat would have the scheduler write off (and kill) the other. A heartbeat that still moves over two
        intervals is a live one; one that does not is a dead process's (a supervisor starting it again)."""
        times = self._keys.heartbeat_times(self._name)
        first = await self._redis.zscore(times, self._consumer)
        interval_s = self._settings.heartbeat_interval_s
        if first is None or now_ms() - first > self._settings.heartbeat_timeout_s * 1000:
            return ""
        await asyncio.sleep(2 * interval_s + 0.1)
        if await self._redis.zscore(times, self._consumer) in (first, None):
            return ""
        return (
            f"replica id {self._consumer} is in use: a live replica heartbeats under it; each worker needs an id of "
            "its own (leave --replica-id out for a new one)"
        )

    async def _load(self) -> Serving | None:
        """Import the deployment and build what serves it; None when that failed (its FAILED heartbeat says why)."""
        try:
            cfg = self._config = await self._desired.get(self._name)
            # The config may have reached Redis some other way than through a checked write.
            self._settings.import_allow_list.check(cfg.import_path, self._name)
            threads = HandlerThreads(cfg.max_ongoing_requests)
            try:
                # Import and constructor may block for a long time (model weights): keep the loop free for heartbeats.
                deployment = await asyncio.to_thread(load, cfg, self._settings.import_allow_list)
                self._heartbeat.version = cfg.code_version()
                serving = Serving(
                    settings=self._settings,
                    redis=self._redis,
                    reader=self._reader,
                    pipeliner=self._pipeliner,
                    replica_id=self.replica_id,
                    config=cfg,
                    deployment=deployment,
                    threads=threads,
                    slots=self._slots,
                    stopping=self._stopping,
                    figures=self._figures,
                    vouch=self._heartbeat.vouch,
                )
                await serving.reconfigure(cfg)
                self._heartbeat.user_config = cfg.user_config_digest()
                if self._after_load is not None:
                    self._after_load()
            except BaseException:
                threads.close()  # nothing will run on them
                raise
            return serving
        except Exception as exc:
            raised = what_was_raised(exc)
            self._heartbeat.message = f"{type(raised).__name__}: {exception_text(raised)}"
            # The user's code failed (its import, its __init__): where is in its traceback. Ours (a ConfigError,
            # say) say all in their message, unless debugging.
            ours = isinstance(exc, StreamServeError) and not self._settings.debug
            logger.error(
                "replica %s: failed to start: %s",
                self.replica_id,
                self._heartbeat.message,
                exc_info=None if ours else exc,
            )
            await self._heartbeat.set_health(ReplicaHealth.FAILED)
            return None

    def _watch_health(self, serving: Serving) -> asyncio.Task[None] | None:
        """Call the deployment's check_health() (if it has one) in the background while serving."""
        check = serving.deployment.check_health
        if check is None:
            return None

        async def watch() -> None:
            problem = await watch_health(
                check,
                lambda: serving.config.health_check_period_s,
                lambda: serving.config.health_check_timeout_s,
                self._stopping,
            )
            if problem:
                await self._unhealthy(serving, problem)

        return asyncio.create_task(watch(), name="check-health")

    async def _unhealthy(self, serving: Serving, problem: str) -> None:
        """Its check failed: say so in the heartbeat, for the scheduler to replace it (it stops it meanwhile), or
        leave when nobody would (DepartureRules.when_unhealthy)."""
        logger.error("replica %s: unhealthy: %s", self.replica_id, problem)
        self._heartbeat.message = problem
        departure = self._rules.when_unhealthy(serving.config, problem)
        if departure is not None:
            self._leave(departure)
            return
        with contextlib.suppress(*RETRYABLE_ERRORS):  # the heartbeat loop says it again on its next beat
            await self._heartbeat.set_health(ReplicaHealth.UNHEALTHY)

    async def _follow(self, serving: Serving, _changed: set[str]) -> None:
        """Apply live changes (user_config, max_ongoing_requests), or leave when the rules for a worker the
        scheduler does not own say so (DepartureRules); the scheduler stops its own replicas."""
        try:
            new = await self._desired.get(self._name)
        except NotFoundError:
            departure = self._rules.when_deleted(serving.config)
            if departure is not None:
                self._leave(departure)
            return  # otherwise the scheduler stops us
        old = serving.config
        # From here on the drain, the health checks and the requests still read go by the new config, even if it
        # makes the replica leave.
        self._config = serving.config = new
        departure = self._rules.when_changed(old, new)
        if departure is not None:
            self._leave(departure)
            return
        loaded = serving.applied
        if new.code_version() != loaded.code_version():
            # Its code is no longer the deployment's: it keeps the user_config it runs until the scheduler replaces
            # it (so its replies are never kept as the new code's cache entries, and old code never runs a new one).
            if new.user_config != old.user_config:
                logger.info("replica %s: the new user_config is for new code; not reconfiguring", self.replica_id)
        elif new.user_config != (old if old.code_version() == loaded.code_version() else loaded).user_config:
            await self._reconfigure(serving, new)  # (after a move back to its code: if the user_config differs)
        if new.max_ongoing_requests != old.max_ongoing_requests:
            logger.info("replica %s: max_ongoing_requests %d", self.replica_id, new.max_ongoing_requests)
            serving.resize(new.max_ongoing_requests)

    async def _reconfigure(self, serving: Serving, new: DeploymentConfig) -> None:
        """Run ``new``'s user_config, or keep the one it runs when its reconfigure() refuses this one; the heartbeat
        says which at once (the scheduler judges the goal and the deployment's health by it)."""
        logger.info("replica %s: reconfiguring with new user_config", self.replica_id)
        beat = self._heartbeat
        try:
            await serving.reconfigure(new)
        except Exception as exc:
            raised = what_was_raised(exc)  # (sys.exit() in it, too: the replica serves on)
            said = f"{type(raised).__name__}: {exception_text(raised)}"
            logger.error("replica %s: reconfigure failed: %s", self.replica_id, said)
            beat.refused_user_config = new.user_config_digest()
            beat.message = f"its reconfigure() refused the new user_config ({said}); it runs with the one before"
        else:
            if beat.refused_user_config:
                beat.refused_user_config, beat.message = "", ""
            beat.user_config = new.user_config_digest()
        await beat.say_now()

    async def _hold_models(self, serving: Serving) -> asyncio.Task[None] | None:
        """For a deployment that multiplexes models: read a routed stream, hold the models its caches load
        (workers/model_holder.py), and renew the holds until the replica exits (the task returned)."""
        if not serving.deployment.multiplexed:
            return None
        streams = ModelStreams(self._redis, self._keys)
        max_models = serving.deployment.max_models
        holder = ModelHolder(self._settings, streams, self._name, self._consumer, self._figures, max_models)
        await holder.start()
        serving.read_routed()
        serving.models = holder
        self._heartbeat.models = lambda: holder.models
        multiplexing.listen(holder)
        return asyncio.create_task(holder.run(), name="models")

    async def _drain(self, serving: Serving) -> None:
        if serving.models is not None:  # it reads no more: its models' queues are other replicas' now
            await self._wind_down("letting go of its models", serving.models.leave())
        await self._heartbeat.set_health(ReplicaHealth.DRAINING)
        serving.flush_batches()  # nothing more will arrive: partial batches need not wait to fill
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(serving.config.graceful_shutdown_timeout_s, self._drain_limit_s)):
                await self._slots.wait_idle()

    async def _goodbye(self, serving: Serving) -> None:
        """Leave no trace: drop the heartbeat, and the consumer if it holds no pending entries.

        A worker about to start again keeps its (DRAINING) heartbeat: the next process's first beat replaces it.
        """
        with contextlib.suppress(*RETRYABLE_ERRORS, ResponseError):
            if not self.restart_reason:
                async with self._redis.pipeline(transaction=True) as pipe:
                    queue_removal(pipe, self._keys, self._name, [self._consumer])
                    await pipe.execute()
            streams = list(self._keys.request_streams(self._name).values())
            if serving.models is not None:
                streams.append(self._keys.routed_requests(self._name, self._consumer))
            for stream in streams:
                pending = await self._redis.xpending_range(stream, CONSUMER_GROUP, "-", "+", 1, self._consumer)
                if not pending:
                    await self._redis.xgroup_delconsumer(stream, CONSUMER_GROUP, self._consumer)
