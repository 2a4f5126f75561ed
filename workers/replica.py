"""One replica: read the deployment's request stream in its consumer group, run the handler, reply.

Lifecycle of the process: load (import + constructor) -> serve -> drain on
SIGTERM -> exit. The replica reports each step in its heartbeat; the
scheduler turns those reports into lifecycle transitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import socket
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from streamserve.workers.batcher import Batchers, DeadlinePassed
from streamserve.workers.finisher import Finisher
from streamserve.workers.health_checks import watch_health
from streamserve.workers.loader import Handler, LoadedDeployment, load
from streamserve.workers.slots import Slots
from streamserve.workers.threads import HandlerThreads

from streamserve.control.desired_state import DesiredState
from streamserve.control.heartbeats import News, news_of, queue_beats, queue_removal
from streamserve.control.long_poll import LongPollSubscriber
from streamserve.metrics.definitions import BATCH_SIZE, HANDLED, HANDLER_DURATION
from streamserve.metrics.figures import Figures
from streamserve.metrics.flusher import MetricsFlusher
from streamserve.runtime.processes import is_running
from streamserve.runtime.settings import Settings
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS, redacted
from streamserve.transport.pipelining import BlockingReader, Pipeliner
from streamserve.transport.streams import Requeuer, ensure_group
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import BadRequestError, NotFoundError, ProtocolError, ResponseTooLargeError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.json_values import dumps
from streamserve.wire.keys import CONSUMER_GROUP, ConfigKey
from streamserve.wire.messages import (
    Fields,
    Heartbeat,
    ReplicaRecord,
    Reply,
    ReplyStatus,
    Request,
    StreamBatches,
    now_ms,
)
from streamserve.wire.states import RETIRED_REPLICA_STATES, ReplicaHealth

logger = logging.getLogger(__name__)

# How long one XREADGROUP waits; also the longest a stop request waits for the read to return.
READ_BLOCK_MS = 500
# At most this many requests delivered by a lost read are recovered at once (a read asks for max_ongoing at most).
UNDELIVERED_MAX = 1000
# How long a replica whose `streamserve up` was killed drains: its Redis is likely gone with it.
FARM_GONE_DRAIN_S = 5.0
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
        self._takes_over = takes_over
        self._settings = settings
        self._pinned_version = pinned_version
        self._after_load = after_load
        self._redis = redis
        self._requeuer = Requeuer(redis)
        self._desired = DesiredState(redis, settings.keys)
        self._pipeliner = Pipeliner(redis)
        self._reader = BlockingReader(redis)
        self._keys = settings.keys
        self.replica_id = replica_id
        self._consumer = replica_id.to_str()
        self._name = replica_id.deployment
        self._stream = self._keys.requests(self._name)
        self._cfg: DeploymentConfig | None = None
        self._deployment: LoadedDeployment | None = None
        self._threads: HandlerThreads | None = None  # where sync handlers run, max_ongoing_requests at most
        self._health = ReplicaHealth.STARTING
        self._message = ""
        self._slots = Slots()
        self._finisher = Finisher(self._pipeliner, self._stream, self._slots.finished, self._consumer)
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._beat_lock = asyncio.Lock()
        self._heartbeat_stop = asyncio.Event()  # set when the replica exits: the heartbeat loop ends
        self._told: News | None = None  # what its last heartbeat said (heartbeats.news_of), None before the first
        self._counted = False  # a scheduler has recorded this replica (so a record that vanishes means "leave")
        self._drain_limit_s = math.inf  # shortened when the farm is gone: nobody is left to answer
        self._loaded_version = ""  # the code version it runs, once loaded (the config may move on meanwhile)
        # Set when an externally started worker should run again as a new process on the deployment's new code.
        self.restart_reason = ""
        self._served = 0
        self._failed = 0
        self._figures = Figures() if settings.metrics else None
        self._batchers = Batchers(
            self._invoke_batch, lambda: self._cfg.max_ongoing_requests if self._cfg else 0, self.replica_id.to_str()
        )

    # -- process lifecycle -----------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether it has stopped reading new requests (asked to, or leaving by itself)."""
        return self._stopping.is_set()

    def request_stop(self) -> None:
        """Stop reading new requests and drain (safe to call from a signal handler)."""
        if not self._stopping.is_set():
            logger.info("replica %s: stop requested, draining %d in flight", self.replica_id, self._slots.held)
        self._stopping.set()
        self._slots.wake()

    async def run(self) -> int:
        """Load, serve until stopped, drain; return the process exit code.

        A worker whose deployment does not exist, or is not at its pinned
        version, exits 1 before it heartbeats: it never serves.
        """
        refusal = await self._refusal()
        if refusal:
            logger.error("replica %s: %s", self.replica_id, refusal)
            return 1
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        metrics = MetricsFlusher(self._redis, self._keys, self._figures) if self._figures is not None else None
        if metrics is not None:
            metrics.start()
        longpoll: LongPollSubscriber | None = None
        loaded = False
        try:
            loaded = await self._load()
            if not loaded:
                return 1  # the FAILED heartbeat stays: it tells the scheduler why
            await ensure_group(self._redis, self._stream)
            longpoll = LongPollSubscriber(
                self._redis, self._keys, lambda k: k == ConfigKey.DEPLOYMENTS, self._on_config_change
            )
            await longpoll.start()
            await self._set_health(ReplicaHealth.READY)
            logger.info("replica %s: ready (pid %d)", self.replica_id, os.getpid())
            health = self._watch_health()
            try:
                await self._read_loop()
            finally:
                if health is not None:
                    health.cancel()
                await self._reader.aclose()
            await self._drain()
            return self._exit_code
        finally:
            if longpoll is not None:
                await self._wind_down("the config subscription", longpoll.close())
            self._heartbeat_stop.set()
            heartbeat.cancel()
            await self._wind_down("the heartbeat", heartbeat)
            await self._wind_down("the batches", self._batchers.aclose())
            if self._threads is not None:
                self._threads.close()  # a handler still running past the drain's grace period is not answered
            await self._wind_down("the replies", self._pipeliner.aclose())
            if metrics is not None:
                await self._wind_down("the last metrics", metrics.aclose())
            if loaded:
                await self._wind_down("the goodbye", self._goodbye())
            logger.info("replica %s: exited after %d requests (%d failed)", self.replica_id, self._served, self._failed)

    async def _wind_down(self, what: str, step: Awaitable[object]) -> None:
        """One step of the exit, bounded: a replica that drained must exit, even if a step hangs (it is named)."""
        try:
            async with asyncio.timeout(WIND_DOWN_STEP_S):
                await step
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the exit itself was cancelled (a cancelled step, such as the heartbeat task, is not)
        except TimeoutError:
            logger.warning(
                "replica %s: %s did not finish within %gs; exiting anyway", self.replica_id, what, WIND_DOWN_STEP_S
            )
        except Exception as exc:  # e.g. Redis gone for good: the exit goes on
            logger.warning(
                "replica %s: %s failed on the way out: %s: %s", self.replica_id, what, type(exc).__name__, exc
            )

    async def _refusal(self) -> str:
        """Why this worker must not start ("" when it may)."""
        url = redacted(self._settings.effective_redis_url)
        try:
            cfg = await self._desired.get(self._name)
        except NotFoundError:
            return f"no deployment named {self._name!r} in Redis at {url}; deploy it first (streamserve deploy CONFIG)"
        except RETRYABLE_ERRORS as exc:
            return f"cannot reach Redis at {url}: {exc}"
        if self._pinned_version is not None and not _is_at(cfg, self._pinned_version):
            return (
                f"deployment {self._name!r} is at version {cfg.version or cfg.code_version()}, "
                f"not {self._pinned_version} (--version); this worker will not serve it"
            )
        return ""

    async def _load(self) -> bool:
        try:
            self._cfg = await self._desired.get(self._name)
            # The config may have reached Redis some other way than through a checked write.
            self._settings.import_allow_list.check(self._cfg.import_path, self._name)
            self._threads = HandlerThreads(self._cfg.max_ongoing_requests)
            # Import and constructor may block for a long time (model weights): keep the loop free for heartbeats.
            self._deployment = await asyncio.to_thread(load, self._cfg)
            self._loaded_version = self._cfg.code_version()
            await self._reconfigure(self._cfg.user_config)
            if self._after_load is not None:
                self._after_load()
            return True
        except Exception as exc:
            self._message = f"{type(exc).__name__}: {exc}"
            logger.error("replica %s: failed to start: %s", self.replica_id, self._message)
            if self._settings.debug:
                logger.error("%s", traceback.format_exc())
            await self._set_health(ReplicaHealth.FAILED)
            return False

    def _watch_health(self) -> asyncio.Task[None] | None:
        """Call the deployment's check_health() (if it has one) in the background while serving."""
        assert self._deployment is not None
        check = self._deployment.check_health
        if check is None:
            return None

        async def watch() -> None:
            problem = await watch_health(
                check,
                lambda: self._cfg.health_check_period_s if self._cfg else 10.0,
                lambda: self._cfg.health_check_timeout_s if self._cfg else 30.0,
                self._stopping,
            )
            if problem:
                await self._unhealthy(problem)

        return asyncio.create_task(watch(), name="check-health")

    async def _unhealthy(self, problem: str) -> None:
        """Its check failed: say so in the heartbeat, for the scheduler to replace it (it stops it meanwhile).

        An externally scaled worker has no scheduler to replace it: it drains and exits 1, for whatever runs it
        (Kubernetes, systemd) to start it again.
        """
        logger.error("replica %s: unhealthy: %s", self.replica_id, problem)
        self._message = problem
        if self._cfg is not None and self._cfg.external_scaler_enabled:
            self._leave(1, f"unhealthy ({problem}): exiting, for its supervisor to start it again")
            return
        with contextlib.suppress(*RETRYABLE_ERRORS):  # the heartbeat loop says it again on its next beat
            await self._set_health(ReplicaHealth.UNHEALTHY)

    async def _reconfigure(self, user_config: Any) -> None:
        assert self._deployment is not None
        fn = self._deployment.reconfigure
        if fn is None or user_config is None:
            return
        assert self._threads is not None
        await self._threads.run(fn, user_config)

    async def _on_config_change(self, _changed: set[str]) -> None:
        """Apply live changes: user_config (reconfigure) and max_ongoing_requests; leave when the code changed.

        The scheduler stops the replicas it started. An externally started
        worker has nobody to stop it, so it leaves by itself: it drains, then
        runs again on the new code (``restart_reason``), or exits 1 when the
        deployment was deleted or has moved past its pinned version.
        """
        try:
            new = await self._desired.get(self._name)
        except NotFoundError:
            if self._cfg is not None and self._cfg.external_scaler_enabled:
                self._leave(1, f"deployment {self._name!r} was deleted")
            return  # otherwise the scheduler stops us
        if self._cfg is None:
            return
        old, self._cfg = self._cfg, new
        if new.code_version() != old.code_version() and (old.external_scaler_enabled or new.external_scaler_enabled):
            if self._pinned_version is not None and not _is_at(new, self._pinned_version):
                self._leave(1, f"deployment {self._name!r} moved on from version {self._pinned_version} (--version)")
            elif new.external_scaler_enabled:
                self.restart_reason = f"deployment {self._name!r} changed its code (version {new.code_version()})"
                self._leave(0, self.restart_reason + ": draining, then starting again on it")
            else:
                self._leave(0, f"deployment {self._name!r} is no longer externally scaled")
            return
        if new.user_config != old.user_config:
            logger.info("replica %s: reconfiguring with new user_config", self.replica_id)
            try:
                await self._reconfigure(new.user_config)
            except Exception as exc:
                logger.error("replica %s: reconfigure failed: %s: %s", self.replica_id, type(exc).__name__, exc)
        if new.max_ongoing_requests != old.max_ongoing_requests:
            logger.info("replica %s: max_ongoing_requests %d", self.replica_id, new.max_ongoing_requests)
            assert self._threads is not None
            self._threads.resize(new.max_ongoing_requests)
            self._slots.wake()

    def _leave(self, exit_code: int, why: str) -> None:
        logger.warning("replica %s: %s", self.replica_id, why)
        self._exit_code = exit_code
        self.request_stop()

    async def _drain(self) -> None:
        await self._set_health(ReplicaHealth.DRAINING)
        self._batchers.flush_now()  # nothing more will arrive: partial batches need not wait to fill
        assert self._cfg is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(self._cfg.graceful_shutdown_timeout_s, self._drain_limit_s)):
                await self._slots.wait_idle()

    async def _goodbye(self) -> None:
        """Leave no trace: drop the heartbeat, and the consumer if it holds no pending entries.

        A worker about to start again keeps its (DRAINING) heartbeat: the next process's first beat replaces it.
        """
        with contextlib.suppress(*RETRYABLE_ERRORS, ResponseError):
            if not self.restart_reason:
                async with self._redis.pipeline(transaction=True) as pipe:
                    queue_removal(pipe, self._keys, self._name, [self._consumer])
                    await pipe.execute()
            pending = await self._redis.xpending_range(self._stream, CONSUMER_GROUP, "-", "+", 1, self._consumer)
            if not pending:
                await self._redis.xgroup_delconsumer(self._stream, CONSUMER_GROUP, self._consumer)

    # -- heartbeats -------------------------------------------------------------

    async def _set_health(self, health: ReplicaHealth) -> None:
        self._health = health
        await self._beat()

    async def _beat(self) -> None:
        # One beat at a time, each built once it holds the lock: the heartbeat loop's beat must never land after
        # (and over) the one that reports a change of health, such as FAILED just before the process exits.
        async with self._beat_lock:
            await self._write_beat()

    async def _write_beat(self) -> None:
        beat = Heartbeat(
            ts_ms=now_ms(),
            health=self._health,
            pid=os.getpid(),
            host=socket.gethostname(),
            ongoing=self._slots.held,
            message=self._message,
            version=self._loaded_version,
        )
        news = news_of(beat)
        async with self._redis.pipeline(transaction=True) as pipe:
            beats = {self._consumer: (beat.ts_ms, beat.encode())}
            queue_beats(pipe, self._keys, self._name, beats, news != self._told)
            if self._takes_over is not None:
                queue_removal(pipe, self._keys, self._name, [self._takes_over])
            pipe.hget(self._keys.replicas(self._name), self._consumer)
            self._told = None  # unknown until the transaction's answer comes: a lost one may or may not have run
            *_, record = await pipe.execute()
        self._takes_over, self._told = None, news
        self._obey(record)

    def _obey(self, raw_record: bytes | None) -> None:
        """Leave when the farm no longer counts this replica: its record says stop, or was there and is gone.

        The scheduler signals the replicas it can see; this covers the rest (another host's, a killed farm's,
        one started by hand that the scheduler found it has no room for). A replica that never had a record
        (no scheduler runs, or one has not looked yet) and an externally scaled worker go on serving.
        """
        if self._stopping.is_set() or (self._cfg is not None and self._cfg.external_scaler_enabled):
            return
        if raw_record is None:
            if self._counted:
                self._leave(0, "its record is gone from the scheduler's replica hash: no farm counts it")
            return
        self._counted = True
        try:
            state = ReplicaRecord.decode(raw_record).state
        except ProtocolError:
            return
        if state in RETIRED_REPLICA_STATES:
            self._leave(0, f"the scheduler retired it (its record says {state.value})")

    async def _heartbeat_loop(self) -> None:
        supervisor = self._settings.supervisor
        # Ends on the flag as well as on cancellation: redis-py can swallow a cancellation that lands in a write
        # (CI saw a replica whose heartbeat task went on beating after it was cancelled, so it never exited).
        while not self._heartbeat_stop.is_set():
            if supervisor is not None and not is_running(supervisor):
                self._leave(1, f"the `streamserve up` that started it (pid {supervisor.partition(':')[0]}) is gone")
                self._drain_limit_s = FARM_GONE_DRAIN_S
                supervisor = None
            try:
                await self._beat()
            except RETRYABLE_ERRORS as exc:
                logger.warning("replica %s: heartbeat failed: %s", self.replica_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_stop.wait(), self._settings.heartbeat_interval_s)

    # -- serving ----------------------------------------------------------------

    async def _read_loop(self) -> None:
        backoff = Backoff()
        lost_a_read = False
        while not self._stopping.is_set():
            assert self._cfg is not None
            free = self._slots.free(self._cfg.max_ongoing_requests)
            if free <= 0:
                await self._slots.wait_for_room()
                continue
            try:
                if lost_a_read:
                    await self._take(await self._undelivered())
                    lost_a_read = False
                read = ("XREADGROUP", "GROUP", CONSUMER_GROUP, self._consumer, "COUNT", free, "BLOCK", READ_BLOCK_MS)
                batches = await self._reader.read((*read, "STREAMS", self._stream, ">"), READ_BLOCK_MS)
                backoff.reset()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await ensure_group(self._redis, self._stream)  # the stream was deleted and made again
                continue
            except RETRYABLE_ERRORS as exc:
                lost_a_read = True
                delay = backoff.next()
                logger.warning("replica %s: read failed (%s); retrying in %.1fs", self.replica_id, exc, delay)
                await asyncio.sleep(delay)
                continue
            await self._take(batches)

    async def _undelivered(self) -> StreamBatches:
        """What Redis delivered to this replica but it does not hold: the reply to a read that was lost with its
        connection. Those entries are pending under this live replica's name, so nobody else would ever run them."""
        history = ("XREADGROUP", "GROUP", CONSUMER_GROUP, self._consumer, "COUNT", UNDELIVERED_MAX, "STREAMS")
        batches = await self._reader.read((*history, self._stream, "0"), READ_BLOCK_MS)  # (no BLOCK: at once)
        lost = [(s, [(i, f) for i, f in entries if not self._slots.holds(i)]) for s, entries in batches]
        if any(entries for _s, entries in lost):
            count = sum(len(entries) for _s, entries in lost)
            logger.warning("replica %s: %d request(s) delivered by a lost read: running them", self.replica_id, count)
        return lost

    async def _take(self, batches: StreamBatches) -> None:
        suspects = []
        for _stream, entries in batches or ():
            for entry_id, fields in entries:
                if b"attempts" in fields:
                    suspects.append((entry_id, fields))
                else:
                    self._accept(entry_id, fields)
        if suspects:
            # Hand the others back first: had this replica still held them, a death would charge them too.
            await self._hand_back([entry_id for entry_id, _ in suspects[1:]])
            await self._run_alone(*suspects[0])

    def _accept(self, entry_id: bytes, fields: Fields) -> None:
        """Take a slot for a request read and start its handler; the rest runs in callbacks, with no task."""
        self._slots.take(entry_id)
        try:
            request = Request.decode(fields)
        except ProtocolError as exc:
            logger.warning("replica %s: dropping malformed entry %s: %s", self.replica_id, entry_id, exc)
            self._slots.handler_returned()
            self._finisher.finish(entry_id)
            return
        started_at = time.perf_counter()
        started = self._start_handler(request)
        if isinstance(started, Reply):
            self._finish(entry_id, request, started)
        else:
            started.add_done_callback(functools.partial(self._on_handler_done, entry_id, request, started_at))

    async def _run_alone(self, entry_id: bytes, fields: Fields) -> None:
        """Run an entry that a dead replica held with nothing else in flight, and read nothing meanwhile.

        Any entry a dying replica held may be what killed it, so each was
        charged an attempt. Run side by side again, a poison request would take
        its neighbours down with it on every delivery until they too reached the
        dead-letter stream; alone, a death is charged to the culprit only.
        """
        await self._slots.wait_idle()
        self._accept(entry_id, fields)
        await self._slots.wait_idle()

    async def _hand_back(self, entry_ids: list[bytes]) -> None:
        """Return suspects read beside the one being run alone to the queue, unrun and uncharged."""
        if not entry_ids:
            return
        assert self._cfg is not None
        await self._requeuer.requeue(
            self._stream,
            self._keys.dead_letters(self._name),
            entry_ids,
            charge=False,
            max_delivery_attempts=self._cfg.max_delivery_attempts,
        )

    def _start_handler(self, request: Request) -> Reply | asyncio.Future[Any]:
        """Start the handler on the request; a Reply instead when there is nothing to run."""
        rid = self._consumer
        if request.deadline_ms and now_ms() > request.deadline_ms:
            return Reply(request.request_id, ReplyStatus.DEADLINE_EXCEEDED, rid)
        assert self._deployment is not None
        try:
            handler = self._deployment.handler(request.method)
            body = orjson.loads(request.body) if request.body else None
        except (BadRequestError, orjson.JSONDecodeError) as exc:
            return Reply(request.request_id, ReplyStatus.BAD_REQUEST, rid, error_message=str(exc))
        try:
            if handler.batch is not None:
                return asyncio.ensure_future(self._batchers.call(request.method, handler, body, request.deadline_ms))
            return self._invoke(handler, body)
        except Exception as exc:
            return self._user_error(request, exc)

    def _invoke(self, handler: Handler, arg: Any) -> asyncio.Future[Any]:
        """Run a handler on one body (or a batch's list): the one place that tells sync from async.

        Async handlers get a task on the loop; sync ones run on a handler thread with no task at all
        (a sync callable that returns a coroutine has it run on the loop: HandlerThreads sees to that).
        """
        if handler.is_async:
            task: asyncio.Future[Any] = asyncio.ensure_future(handler.fn(arg))
            return task
        assert self._threads is not None
        return self._threads.run(handler.fn, arg)

    def _invoke_batch(self, handler: Handler, bodies: list[Any]) -> asyncio.Future[Any]:
        """Run a batched handler on one batch (counting the batch's size)."""
        if self._figures is not None:
            self._figures.observe(self._name, BATCH_SIZE, len(bodies))
        return self._invoke(handler, bodies)

    def _on_handler_done(self, entry_id: bytes, request: Request, started_at: float, done: asyncio.Future[Any]) -> None:
        if done.cancelled():  # stopping: the entry stays pending, to be claimed again
            self._slots.handler_returned()
            self._slots.finished([entry_id])
            return
        reply = self._reply_for(request, done)
        if self._figures is not None:
            self._figures.observe(self._name, HANDLER_DURATION, time.perf_counter() - started_at)
        self._finish(entry_id, request, reply)

    def _finish(self, entry_id: bytes, request: Request, reply: Reply) -> None:
        """Free the request's slot and hand its reply to the Finisher (no reply when nobody waits for one)."""
        self._slots.handler_returned()
        self._served += 1
        if self._figures is not None:
            self._figures.count(self._name, HANDLED, reply.status.value)
        if reply.status is not ReplyStatus.OK:
            self._failed += 1
        self._finisher.finish(entry_id, reply if request.reply_to else None, request.reply_to)

    def _reply_for(self, request: Request, done: asyncio.Future[Any]) -> Reply:
        raised = done.exception()
        if isinstance(raised, DeadlinePassed):
            return Reply(request.request_id, ReplyStatus.DEADLINE_EXCEEDED, self._consumer)
        if raised is not None:
            return self._user_error(request, raised)
        try:
            body = dumps(done.result())
        except Exception as exc:  # the result has no exact JSON form
            return self._user_error(request, exc, "the handler's result cannot be sent as JSON: ")
        assert self._cfg is not None
        if len(body) > self._cfg.max_response_bytes:  # never written to Redis
            return self._user_error(
                request,
                ResponseTooLargeError(
                    f"the handler's result is {len(body)} bytes of JSON, above max_response_bytes "
                    f"({self._cfg.max_response_bytes})"
                ),
            )
        return Reply(request.request_id, ReplyStatus.OK, self._consumer, body=body)

    def _user_error(self, request: Request, exc: BaseException, context: str = "") -> Reply:
        """The reply to a request whose handler raised ``exc``; logged here at ERROR with its traceback (the reply
        carries the traceback only with STREAMSERVE_DEBUG=1)."""
        logger.error(
            "replica %s: the handler raised on request %s: %s%s: %s",
            self._consumer,
            request.request_id,
            context,
            type(exc).__name__,
            exc,
            exc_info=exc,
            extra={"request_id": request.request_id, "deployment": self._name, "replica_id": self._consumer},
        )
        message = context + str(exc)
        if self._settings.debug:
            message += "\n" + "".join(traceback.format_exception(exc))
        return Reply(
            request.request_id,
            ReplyStatus.USER_ERROR,
            self._consumer,
            error_type=type(exc).__name__,
            error_message=message,
        )


def _is_at(cfg: DeploymentConfig, version: str) -> bool:
    """Whether a deployment is at ``version``: its declared ``version`` or its code version."""
    return version in (cfg.version, cfg.code_version())
