"""The serving half of a replica, built once its deployment has loaded: read requests, run the handler, reply.

A request has no asyncio task of its own: it is read, its handler started,
and its reply handed to the Finisher by callbacks on the handler's future
(why: the README's "Design decisions, and why"). Async handlers still get a
task, as they must.

Each request a handler runs has a RequestScope (runtime/request_scope.py),
kept by entry id while it runs, which is what a cancellation (a CancelRequest
on the replica's control stream) finds: an async handler's task is cancelled,
a generator closed, a sync handler told through ``streamserve.cancelled()``. A
cancelled request is acknowledged without a reply (its caller has stopped
waiting) and counted; a cancellation that arrives before the read that
delivered the request is remembered, and the request never starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from streamserve.metrics.definitions import (
    BATCH_SIZE,
    CANCELLED,
    HANDLED,
    HANDLER_DURATION,
    QUEUED_STAGE,
    RUNNING_STAGE,
)
from streamserve.metrics.figures import Figures
from streamserve.runtime import trace_context, tracing
from streamserve.runtime.request_scope import RequestScope, run_in
from streamserve.runtime.settings import Settings
from streamserve.transport import settling
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS, WriteRefusals, refuses_writes
from streamserve.transport.pipelining import BlockingReader, Command, Pipeliner, failure_of
from streamserve.transport.streams import Requeuer, ensure_groups
from streamserve.wire import scripts, shared_runs
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import (
    BadRequestError,
    ProtocolError,
    RequestTimeoutError,
    ResponseTooLargeError,
    streaming_only_message,
)
from streamserve.wire.ids import ReplicaID
from streamserve.wire.json_values import dumps
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import (
    CancelRequest,
    Fields,
    Reply,
    ReplyStatus,
    Request,
    StreamBatches,
    now_ms,
    reply_address,
)
from streamserve.wire.models import no_model_message, routed_lane
from streamserve.wire.priorities import (
    FAIR_TURNS,
    PRIORITIES,
    READ_ORDERS,
    Priority,
    group_refs,
    lane_ref,
    priority_lane,
)
from streamserve.workers.batcher import Batchers, DeadlinePassed
from streamserve.workers.contained import contained, exception_text, what_was_raised
from streamserve.workers.control_reader import ControlHandler
from streamserve.workers.finisher import Finisher
from streamserve.workers.loader import Handler, LoadedDeployment
from streamserve.workers.model_holder import ModelHolder
from streamserve.workers.request_spans import RequestSpans
from streamserve.workers.slots import Slots
from streamserve.workers.streaming import Stream, Streams
from streamserve.workers.threads import HandlerThreads

logger = logging.getLogger(__name__)

# How long one XREADGROUP waits; also the longest a stop request waits for the read to return.
READ_BLOCK_MS = 500
# After a read of at most this many requests, the reader lets the loop turn this often before it reads again, so
# that the handlers it started reach Redis with their replies (or a stream's first chunk) ahead of the next read's
# write: a handler's reply is three turns away (its task, the finisher's flush, the round trip's task). Under load,
# when reads bring more, it reads again at once.
LIGHT_READ = 4
LIGHT_READ_TURNS = 4
# After reading a request that is not ``normal``, a replica reads by priority (scripts.TAKE) this long.
MIXED_PRIORITIES_S = 10.0
# At most this many requests delivered by a lost read are recovered at once (a read asks for max_ongoing at most).
UNDELIVERED_MAX = 1000
# How often running async handlers are checked for a passed deadline (their task is then cancelled).
DEADLINE_SWEEP_S = 0.05
# How often the shared runs (of idempotency keys, cached requests) whose handlers run on past their deadline have their
# records kept (scripts.KEEP_RUN), for shared_runs.RUNNING_RECORD_GRACE_MS from then: well within it.
OVERDUE_RUNS_SWEEP_S = 5.0
# Cancellations of entries the replica does not hold (yet: their read is on its way; or no more: they just ended)
# are remembered this long, and this many at most.
EARLY_CANCEL_KEEP_S = 60.0
EARLY_CANCEL_MAX = 10_000
# A RequestTimeoutError that a handler raises this close to its request's deadline, or past it, is that deadline
# passing (a call it made through a handle inherits the deadline, and its timer fires as the request's does).
INHERITED_DEADLINE_SLACK_MS = 50


class Serving:
    """Serves a loaded deployment from its request stream until the replica stops."""

    def __init__(
        self,
        *,
        settings: Settings,
        redis: aioredis.Redis,
        reader: BlockingReader,
        pipeliner: Pipeliner,
        replica_id: ReplicaID,
        config: DeploymentConfig,
        deployment: LoadedDeployment,
        threads: HandlerThreads,
        slots: Slots,
        stopping: asyncio.Event,
        figures: Figures | None,
        vouch: Callable[[], Awaitable[None] | None] | None = None,
    ) -> None:
        """``reader`` and ``pipeliner``: the replica's connections (the replica closes them). ``threads``: where
        sync handlers run, max_ongoing_requests at most. ``stopping``: set when it must read no more.
        ``figures``: None when metrics are off. ``vouch``: awaited before what a read brought runs, to learn whether
        the farm still counts this replica (ReplicaHeartbeat.vouch)."""
        self._settings = settings
        self._redis = redis
        self._reader = reader
        self._vouch = vouch
        self._requeuer = Requeuer(redis, settings.keys)
        self._keys = settings.keys
        self._consumer = replica_id.to_str()
        self._name = replica_id.deployment
        # The request streams by priority, highest first; and the lane and priority of each stream it reads (as a
        # read names it): the levels', and its routed one in a multiplexing deployment (wire/models.py).
        self._streams = self._keys.request_streams(self._name)
        self._lane_of = {stream.encode(): (priority_lane(p), p) for p, stream in self._streams.items()}
        self._routed: list[str] = []  # its routed stream, once it reads one (read_routed)
        # A blocking read's tail: new entries of every stream it reads.
        self._read_new = ("STREAMS", *self._streams.values(), *(">" for _ in self._streams))
        # The models it holds, for a deployment that multiplexes them (the replica sets it).
        self.models: ModelHolder | None = None
        self._lane_streams: dict[bytes, str] = {}
        self._take_script = redis.register_script(scripts.TAKE)
        # Reads so far that took priorities into account (READ_ORDERS' turn), and until when (monotonic) reads do:
        # from the last time this replica read a request that is not ``normal``, for MIXED_PRIORITIES_S.
        self._turn = 0
        self._mixed_until = 0.0
        # The order the last read took the levels in (TAKE's), None for a blocking read.
        self._order: tuple[Priority, ...] | None = None
        # Whether the last read took as many requests as there was room for: more may be waiting.
        self._filled = False
        # The deployment's config as of now: the replica replaces it when it changes (its limits apply at once).
        self.config = config
        # The config whose user_config the deployment's state reflects (its reconfigure has returned; the config a
        # departing replica of an older version was loaded with): a reply is kept as a response-cache entry only for
        # the config it was made under, which ``config`` may be ahead of. By entry id, for requests with a cache
        # digest, the one each started under; None for one that ran while a reconfigure() did: its handler may have
        # seen either user_config (or a mix), so its reply is kept under neither.
        self.applied = config
        self._made_under: dict[bytes, DeploymentConfig | None] = {}
        self._reconfiguring = False
        self.deployment = deployment
        self._threads = threads
        self._slots = slots
        self._stopping = stopping
        self._figures = figures
        # Its requests' spans, when it traces (runtime/tracing.py); None: tracing is off, and nothing here makes one.
        tracer = tracing.tracer()
        self._spans = RequestSpans(tracer, self._name, self._consumer) if tracer is not None else None
        finished = slots.finished if self._spans is None else self._spans_acknowledged
        self._finisher = Finisher(pipeliner, self._lane_stream, finished, self._consumer)
        self._batchers = Batchers(self._invoke_batch, lambda: self.config.max_ongoing_requests, self._consumer)
        self.streams = Streams(
            pipeliner=pipeliner,
            threads=threads,
            replica_id=self._consumer,
            deployment=self._name,
            figures=figures,
            user_error=self._user_error,
        )
        self.served = 0
        self.failed = 0
        self._loop = asyncio.get_running_loop()
        # The requests whose handler runs, by entry id; those of them that have a shared run (an idempotency key's, a
        # cached request's), whose record is kept while they run on past their deadline (_keep_overdue_runs).
        self._running: dict[bytes, RequestScope] = {}
        self._shared_runs: dict[bytes, Request] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._pipeliner = pipeliner
        # Redis refusing its reads (a full disk): told once per episode.
        self._refusals = WriteRefusals(logger, f"replica {self._consumer}")
        # Set when a request this replica runs first calls a deployment through a handle, or when the stream run
        # alone pauses for its reader: it waits outside the replica (_run_alone).
        self._waited_outside = asyncio.Event()
        self._note_wait_outside = self._waited_outside.set
        # Entry ids cancelled while this replica did not hold them -> when (monotonic), oldest first.
        self._early_cancels: dict[bytes, float] = {}

    # -- configuration ---------------------------------------------------------

    def read_routed(self) -> None:
        """Read this replica's routed stream from now on besides the levels' (a multiplexing deployment's: requests
        for the models it holds, wire/models.py), just before ``normal``'s: its entries are normal-priority ones
        that this replica is best placed to run."""
        self._routed = [self._keys.routed_requests(self._name, self._consumer)]
        self._lane_of = {stream.encode(): (priority_lane(p), p) for p, stream in self._streams.items()}
        self._lane_of[self._routed[0].encode()] = (routed_lane(self._consumer), Priority.NORMAL)
        streams = self._in_turn(PRIORITIES)
        self._read_new = ("STREAMS", *streams, *(">" for _ in streams))

    def _in_turn(self, order: tuple[Priority, ...]) -> list[str]:
        """The streams it reads, its levels in ``order``, its routed one just before ``normal``."""
        streams = []
        for priority in order:
            if priority is Priority.NORMAL:
                streams += self._routed
            streams.append(self._streams[priority])
        return streams

    def _lane_stream(self, lane: bytes) -> str:
        stream = self._lane_streams.get(lane)
        if stream is None:
            stream = self._lane_streams[lane] = self._keys.lane_stream(self._name, lane)
        return stream

    async def reconfigure(self, config: DeploymentConfig) -> None:
        """Call the deployment's ``reconfigure(config.user_config)`` when there is a user_config; once it has returned,
        replies are made under ``config`` (``applied``). A deployment with no reconfigure() to take one (a function,
        say) is warned about: its user_config reaches no code (it still counts in its version and cache keys)."""
        fn = self.deployment.reconfigure
        if config.user_config is not None:
            if fn is None:
                logger.warning(
                    "replica %s: deployment %r has a user_config, but %s has no reconfigure(user_config) method to "
                    "take it: it reaches no code (it still counts in the deployment's version and response cache)",
                    self._consumer,
                    self._name,
                    config.import_path,
                )
            else:
                self._reconfiguring = True
                self._made_under = dict.fromkeys(self._made_under)  # what runs now may see the new one's state
                try:
                    await self._threads.run(fn, config.user_config)
                finally:
                    self._reconfiguring = False
        self.applied = config

    def resize(self, max_ongoing_requests: int) -> None:
        """Hold up to ``max_ongoing_requests`` from now on (``config`` says so already)."""
        self._threads.resize(max_ongoing_requests)
        self._slots.wake()

    # -- the end of serving ----------------------------------------------------

    def flush_batches(self) -> None:
        """Run the partial batches without waiting for them to fill: nothing more will arrive (the replica drains)."""
        self._batchers.flush_now()

    async def close_batches(self) -> None:
        """Cancel batches still running (the drain's grace period is over) and log what was batched."""
        await self._batchers.aclose()

    def close_streams(self) -> None:
        """Stop the streams still running past the drain's grace period, unanswered (their entries stay pending)."""
        self.streams.close()

    def close_threads(self) -> None:
        """End the handler threads: a handler still running past the drain's grace period is not answered."""
        if self._keeper is not None:
            self._keeper.cancel()
        self._threads.close()

    # -- reading ---------------------------------------------------------------

    async def serve(self) -> None:
        """Read and run requests until the replica stops."""
        overdue = asyncio.create_task(self._stop_overdue(), name="deadlines")
        if self._keeper is None:  # (kept through the drain, until close_threads: handlers run on in it)
            self._keeper = asyncio.create_task(self._keep_overdue_runs(), name="overdue-runs")
        try:
            await self._read_until_stopped()
        finally:
            overdue.cancel()

    async def _read_until_stopped(self) -> None:
        backoff = Backoff()
        lost_a_read = lost_groups = False
        while not self._stopping.is_set():
            free = self._slots.free(self.config.max_ongoing_requests)
            if free <= 0:
                await self._slots.wait_for_room()
                continue
            try:
                if lost_groups:  # a stream was deleted and made again
                    await ensure_groups(self._redis, self._keys, self._name)
                    if self.models is not None:
                        await self.models.renew()  # (its routed stream, given back while this replica was away)
                    lost_groups = False
                if lost_a_read:
                    if self._vouch is not None and (beat := self._vouch()) is not None:
                        await _refused_or_done(beat)  # (as below: Redis full, what was read runs)
                    if not self._stopping.is_set():  # (else the scheduler frees them: it wrote this replica off)
                        await self._take(await self._undelivered())
                    lost_a_read = False
                batches = await self._read(free)
                if batches and self._vouch is not None and (beat := self._vouch()) is not None:
                    try:
                        await _refused_or_done(beat)
                    except Exception:  # what was read waits, pending under this replica, for the next try
                        lost_a_read = True
                        raise
                backoff.reset()
            # Before ResponseError: a Redis Cluster failing over refuses with CLUSTERDOWN or TRYAGAIN, which redis-py
            # raises as ResponseErrors; they mean Redis is away for a moment, as a lost connection does.
            except RETRYABLE_ERRORS as exc:
                lost_a_read = True
                delay = backoff.next()
                logger.warning("replica %s: read failed (%s); retrying in %.1fs", self._consumer, exc, delay)
                await asyncio.sleep(delay)
                continue
            except ResponseError as exc:
                if self._refusals.refused(exc):  # XREADGROUP writes (its pending entries): no read until Redis can
                    await asyncio.sleep(backoff.next())
                    continue
                if "NOGROUP" not in str(exc):
                    raise
                lost_groups = True
                continue
            self._refusals.accepted()
            if self._stopping.is_set():  # (written off, say, while the read waited): what it brought runs elsewhere
                await self._hand_back([ref for ref, _ in self._in_order(batches)])
                return
            took = await self._take(batches, free)
            if 0 < took <= LIGHT_READ:
                for _ in range(LIGHT_READ_TURNS):
                    await asyncio.sleep(0)

    async def _read(self, free: int) -> StreamBatches:
        """Up to ``free`` requests, highest priority first (wire/priorities.py).

        A blocking XREADGROUP on every level's stream when the queues may be
        empty, as every deployment that gets only ``normal`` requests always
        reads: one round trip, and no script. While requests of other levels
        come (or the replica has a routed stream: wire/models.py), and the last
        read filled the room (more may be queued), the TAKE script reads the
        streams in this turn's order instead, since one XREADGROUP takes from
        each stream alike.
        """
        if self._filled and (self._routed or time.monotonic() < self._mixed_until):
            order = READ_ORDERS[self._turn % FAIR_TURNS]
            self._turn += 1
            streams = self._in_turn(order)
            take: Command = (
                "EVALSHA",
                self._take_script.sha,
                len(streams),
                *streams,
                CONSUMER_GROUP,
                self._consumer,
                free,
            )
            try:
                batches = await self._reader.read(take, READ_BLOCK_MS)
            except NoScriptError:  # a restarted or flushed Redis
                await self._redis.script_load(scripts.TAKE)
                batches = await self._reader.read(take, READ_BLOCK_MS)
            if batches:
                self._order = order
                return batches
        self._order = None  # ordered by the next turn, should it find several levels
        read = ("XREADGROUP", "GROUP", CONSUMER_GROUP, self._consumer, "COUNT", free, "BLOCK", READ_BLOCK_MS)
        return await self._reader.read((*read, *self._read_new), READ_BLOCK_MS)

    async def _stop_overdue(self) -> None:
        """Cancel the task of every async handler still running past its request's deadline."""
        while True:
            await asyncio.sleep(DEADLINE_SWEEP_S)
            now = now_ms()
            overdue = [s for s in self._running.values() if s.deadline_stop is not None and 0 < s.deadline_ms <= now]
            for scope in overdue:
                scope.stop_overdue()

    async def _keep_overdue_runs(self) -> None:
        """Keep the record of every shared run whose handler runs on past its request's deadline (a sync handler
        cannot be stopped), for as long as it runs: a record left to lapse let a retry with the same idempotency key
        run the handler a second time, and this run's reply, once it came, was not kept."""
        while True:
            await asyncio.sleep(OVERDUE_RUNS_SWEEP_S)
            now = now_ms()
            for request in list(self._shared_runs.values()):
                if 0 < request.deadline_ms < now:
                    run_keys = self._keys.shared_run(self._name, request.idem, request.cache, request.tenant)
                    command = ("EVAL", scripts.KEEP_RUN, 2, *run_keys, request.run, shared_runs.RUNNING_RECORD_GRACE_MS)
                    self._pipeliner.execute(command).add_done_callback(_note_keep_failure)

    # -- cancellation ----------------------------------------------------------

    @property
    def control_handlers(self) -> dict[bytes, ControlHandler]:
        """What the replica does with messages on its control stream, by their ``kind``."""
        return {**self.streams.control_handlers, b"cancel": self._cancel}

    def _cancel(self, fields: Fields) -> None:
        entry_id = CancelRequest.decode(fields).entry_id.encode()
        scope = self._running.get(entry_id)
        if scope is not None:
            if 0 < scope.deadline_ms <= now_ms() + INHERITED_DEADLINE_SLACK_MS:
                # Its caller gave up at its deadline (a timeout cancels the request): the deadline stops it, and it
                # ends as deadline_exceeded, not as cancelled (a stream's own deadline timer, a sync handler that
                # reads streamserve.cancelled(), an async one's task cancelled here).
                scope.stop_overdue()
                return
            scope.cancel()
            return
        early = self._early_cancels
        early[entry_id] = now = time.monotonic()
        while len(early) > EARLY_CANCEL_MAX or next(iter(early.values())) < now - EARLY_CANCEL_KEEP_S:
            del early[next(iter(early))]

    async def _undelivered(self) -> StreamBatches:
        """What Redis delivered to this replica but it does not hold: the reply to a read that was lost with its
        connection. Those entries are pending under this live replica's name, so nobody else would ever run them."""
        history = ("XREADGROUP", "GROUP", CONSUMER_GROUP, self._consumer, "COUNT", UNDELIVERED_MAX, "STREAMS")
        streams = self._in_turn(PRIORITIES)
        batches = await self._reader.read((*history, *streams, *("0" for _ in streams)), READ_BLOCK_MS)  # at once
        holds = self._slots.holds
        lost = [
            (s, [(i, f) for i, f in entries if not holds(lane_ref(self._lane_of[s][0], i))]) for s, entries in batches
        ]
        if any(entries for _s, entries in lost):
            count = sum(len(entries) for _s, entries in lost)
            logger.warning("replica %s: %d request(s) delivered by a lost read: running them", self._consumer, count)
        return lost

    async def _take(self, batches: StreamBatches, room: int | None = None) -> int:
        """Run what a read delivered, highest priority first; past ``room`` (None: no bound), hand the rest back.
        How many it delivered."""
        entries = self._in_order(batches)
        delivered = len(entries)
        self._filled = room is not None and len(entries) >= room
        if room is not None and len(entries) > room:  # one XREADGROUP read several levels: rare
            await self._hand_back([ref for ref, _ in entries[room:]])
            entries = entries[:room]
        suspects = []
        for ref, fields in entries:
            if self._suspect(fields):
                suspects.append((ref, fields))
            else:
                self._accept(ref, fields)
        if suspects and self._calls_out():  # they run beside the others: see _run_alone
            for ref, fields in suspects:
                self._accept(ref, fields)
        elif suspects:
            # Hand the others back first: had this replica still held them, a death would charge them too.
            await self._hand_back([ref for ref, _ in suspects[1:]])
            await self._run_alone(*suspects[0])
        return delivered

    def _suspect(self, fields: Fields) -> bool:
        """Whether a request read is run alone (``_run_alone``): one that a dead replica held, and that one more death
        would dead-letter. Before its last delivery a request read again runs beside the others: most deaths (kill -9,
        a replica out of memory, a host lost) are no request's fault, and run one at a time the last of many
        re-delivered requests passed their deadline. A poison request kills its neighbours once more, which charges
        them a second attempt; they then run alone, and only the culprit reaches the dead-letter stream."""
        attempts = fields.get(b"attempts")
        if attempts is None:
            return False
        try:
            return int(attempts) + 1 >= self.config.max_delivery_attempts
        except ValueError:
            return True  # (not a number: refused when it is decoded)

    def _in_order(self, batches: StreamBatches) -> list[tuple[bytes, Fields]]:
        """A read's entries, named by their refs, in this turn's priority order."""
        if not batches:
            return []
        lane_of = self._lane_of
        if len(batches) == 1 and not lane_of[batches[0][0]][0]:
            return batches[0][1]  # normal entries are named by their ids
        if any(lane_of[stream][1] is not Priority.NORMAL for stream, _ in batches):
            self._mixed_until = time.monotonic() + MIXED_PRIORITIES_S
            order = self._order
            if order is None:
                order = READ_ORDERS[self._turn % FAIR_TURNS]
                self._turn += 1
        else:
            order = PRIORITIES  # normal and models' entries only
        rank = {stream.encode(): i for i, stream in enumerate(self._in_turn(order))}
        ordered = sorted(batches, key=lambda batch: rank.get(batch[0], len(rank)))
        return [
            (lane_ref(lane, entry_id), fields)
            for stream, entries in ordered
            for lane in (lane_of[stream][0],)
            for entry_id, fields in entries
        ]

    async def _run_alone(self, entry_id: bytes, fields: Fields) -> None:
        """Run an entry that a dead replica held with nothing else in flight, and read nothing meanwhile.

        Any entry a dying replica held may be what killed it, so each was
        charged an attempt. Run side by side again, a poison request would take
        its neighbours down with it on every delivery until they too reached the
        dead-letter stream; alone, a death is charged to the culprit only.

        Except where a request calls a deployment through a handle: its call may wait behind what this replica
        would read next (a deployment that calls itself, or calls one that calls it), and so for ever if the
        replica read nothing. Once a request this replica runs has made such a call, suspects run beside the rest,
        and the one run alone makes the replica read again once it calls. So does the one run alone once its
        stream pauses for its caller to read on (``max_unread_chunks`` behind), which may be never before its
        deadline (a caller that keeps its stream open unread).

        A stop ends either wait: the read loop must return for the drain to begin, whose bound (the deployment's
        graceful_shutdown_timeout_s; FARM_GONE_DRAIN_S once its `up` died and its replies may never go out) holds
        this request as any other. One that has not started by then goes back to the queue, unrun and uncharged.
        """
        self._waited_outside.clear()
        if self._calls_out():  # (a call made while the others were handed back)
            self._accept(entry_id, fields)
            return
        if not await self._idle_unless_stopping():
            with contextlib.suppress(*RETRYABLE_ERRORS):  # else it stays pending: freed once this replica is gone
                await self._hand_back([entry_id])
            return
        self._accept(entry_id, fields)
        if (scope := self._running.get(entry_id)) is not None:
            scope.on_reader_wait = self._note_wait_outside
            if scope.reader_waits:
                self._waited_outside.set()
        await self._idle_unless_stopping()  # at once if a wait outside ended the first: it runs beside the others

    def _calls_out(self) -> bool:
        """Whether a request this replica runs has called a deployment through a handle."""
        return any(scope.made_calls for scope in self._running.values())

    async def _idle_unless_stopping(self) -> bool:
        """Wait until the replica holds no request, or a request it runs waits outside it, or it stops; whether it
        goes on (it does not stop)."""
        waits = [self._slots.wait_idle(), self._stopping.wait(), self._waited_outside.wait()]
        tasks = [asyncio.ensure_future(wait) for wait in waits]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
        return not self._stopping.is_set()

    async def _hand_back(self, entry_ids: list[bytes]) -> None:
        """Return suspects to the queue, unrun and uncharged: those read beside the one run alone, or that one when
        the replica stops before it starts. Redis away: tried again until it is back (or the replica stops, leaving
        them pending for the reclaimer), as a read is; the error ended the replica, charging every request it held."""
        backoff = Backoff()
        for lane, ids in group_refs(entry_ids).items():
            while ids:
                try:
                    await self._requeuer.requeue(
                        self._name,
                        ids,
                        charge=False,
                        max_delivery_attempts=self.config.max_delivery_attempts,
                        lane=lane,
                    )
                    break
                except Exception as exc:  # (sent again after a lost answer, it finds them gone: no harm)
                    if not isinstance(exc, RETRYABLE_ERRORS) and not refuses_writes(exc):
                        raise
                    if self._stopping.is_set():
                        return
                    delay = backoff.next()
                    logger.warning(
                        "replica %s: could not hand %d request(s) back (%s); retrying in %.1fs",
                        self._consumer,
                        len(ids),
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)

    # -- one request -----------------------------------------------------------

    def _accept(self, entry_id: bytes, fields: Fields) -> None:
        """Take a slot for a request read and start its handler; the rest runs in callbacks, with no task."""
        self._slots.take(entry_id)
        try:
            request = Request.decode(fields)
        except ProtocolError as exc:
            logger.warning("replica %s: dropping malformed entry %s: %s", self._consumer, entry_id, exc)
            self._slots.handler_returned()
            # Its caller, when the entry says who that is, is told at once rather than left to its deadline.
            address = reply_address(fields)
            if address is None:
                self._finisher.finish(entry_id)
                return
            request_id, reply_to, tag = address
            why = f"the request could not be read, and was not run: {exc}"
            reply = Reply(request_id, ReplyStatus.BAD_REQUEST, self._consumer, error_message=why, tag=tag)
            self._finisher.finish(entry_id, reply, reply_to)
            return
        started_at = time.perf_counter()
        if request.cache:
            self._made_under[entry_id] = None if self._reconfiguring else self.applied
        model = request.model if self.models is not None else ""  # (one without models ignores it)
        scope = RequestScope(request.request_id, request.deadline_ms, request.priority, request.tenant, model)
        scope.on_call = self._note_wait_outside
        if self._spans is not None:
            self._spans.started(entry_id, request, scope)
        started = self._start_handler(entry_id, request, scope, started_at)
        if isinstance(started, Reply):
            self._finish(entry_id, request, started, scope=scope)
            return
        self._running[entry_id] = scope
        if request.run:
            self._shared_runs[entry_id] = request
        if started is not None:
            started.add_done_callback(functools.partial(self._on_handler_done, entry_id, request, started_at))

    def _start_handler(
        self, entry_id: bytes, request: Request, scope: RequestScope, started_at: float
    ) -> Reply | asyncio.Future[Any] | None:
        """Start the handler on the request; a Reply instead when there is nothing to run, None for a stream (it
        finishes by itself)."""
        rid = self._consumer
        if self._early_cancels and self._early_cancels.pop(entry_id, None) is not None:
            return request.reply(ReplyStatus.CANCELLED, rid, error_message=QUEUED_STAGE)
        if request.deadline_ms and now_ms() > request.deadline_ms:
            return request.reply(ReplyStatus.DEADLINE_EXCEEDED, rid)
        if self.deployment.multiplexed and not request.model:
            return request.reply(ReplyStatus.BAD_REQUEST, rid, error_message=no_model_message(self._name))
        try:
            handler = self.deployment.handler(request.method)
            body = orjson.loads(request.body) if request.body else None
        except (BadRequestError, orjson.JSONDecodeError) as exc:
            return request.reply(ReplyStatus.BAD_REQUEST, rid, error_message=str(exc))
        try:
            if handler.is_stream:
                return self._start_stream(entry_id, request, handler, body, scope, started_at)
            if handler.batch is not None:
                sized = self._spans.batched(scope) if self._spans is not None else None
                calling = self._batchers.call(request.method, handler, body, request.deadline_ms, sized, scope.model)
                batched = asyncio.ensure_future(calling)
                scope.stop = batched.cancel
                return batched
            return self._invoke(handler, body, scope)
        except Exception as exc:
            return self._user_error(request, exc)

    def _invoke(self, handler: Handler, arg: Any, scope: RequestScope | None = None) -> asyncio.Future[Any]:
        """Run a handler on one body (or a batch's list, with no ``scope``): the one place that tells sync from async.

        Async handlers get a task on the loop, which cancellation or the deadline cancels; sync ones run on a handler
        thread with no task at all (a sync callable that returns a coroutine has it run on the loop: HandlerThreads
        sees to that), told of a cancellation by ``streamserve.cancelled()``.
        """
        if handler.is_async:
            if scope is None:
                batch: asyncio.Future[Any] = asyncio.ensure_future(contained(handler.fn(arg)))
                return batch
            task = self._loop.create_task(contained(handler.fn(arg)), context=scope.context())
            scope.stop = scope.deadline_stop = task.cancel
            return task
        if scope is None:
            return self._threads.run(handler.fn, arg)
        return self._threads.run(functools.partial(run_in, scope, handler.fn), arg)

    def _invoke_batch(self, handler: Handler, bodies: list[Any], model: str) -> asyncio.Future[Any]:
        """Run a batched handler on one batch, whose requests name ``model`` (counting the batch's size)."""
        if self._figures is not None:
            self._figures.observe(self._name, BATCH_SIZE, len(bodies))
        if not model:
            return self._invoke(handler, bodies)
        # The batch's own scope: streamserve.model_id() in the call is its requests' model. (Each request's deadline
        # and cancellation stay its own: a batch is cut short by none of them.)
        return self._invoke(handler, bodies, RequestScope("", 0, model=model))

    def _start_stream(
        self, entry_id: bytes, request: Request, handler: Handler, body: Any, scope: RequestScope, started_at: float
    ) -> Reply | None:
        """Run a streaming handler (workers/streaming.py); a BAD_REQUEST for a caller that waits for one result (a
        request that nobody waits for, send()'s or an endpoint's shadow copy, runs with its chunks dropped)."""
        if request.reply_to and not request.stream:
            message = streaming_only_message(self._name, request.method)
            return request.reply(ReplyStatus.BAD_REQUEST, self._consumer, error_message=message)
        stream = self.streams.start(request, handler, body, self.config, scope)
        stream.outcome.add_done_callback(functools.partial(self._on_stream_done, entry_id, request, started_at, stream))
        return None

    def _on_handler_done(self, entry_id: bytes, request: Request, started_at: float, done: asyncio.Future[Any]) -> None:
        scope = self._running.pop(entry_id, None)
        if scope is not None and scope.is_cancelled:  # whatever it returned, nobody waits for it
            if not done.cancelled():
                done.exception()  # what it raised (RequestCancelledError from a handle, say) is nobody's to log
            reply = request.reply(ReplyStatus.CANCELLED, self._consumer, error_message=RUNNING_STAGE)
        elif done.cancelled():
            if scope is None or not scope.stopped_overdue:
                self._leave_pending(entry_id)  # stopping: the entry stays pending, to be claimed again
                return
            # Its deadline passed while it ran: stopped, and counted as cancelled (the caller has its timeout already).
            self._count_cancelled(RUNNING_STAGE)
            reply = request.reply(ReplyStatus.DEADLINE_EXCEEDED, self._consumer)
        else:
            reply = self._reply_for(request, done)
            if reply.status is not ReplyStatus.DEADLINE_EXCEEDED and 0 < request.deadline_ms <= now_ms():
                # Its deadline passed while it ran (a sync handler: streamserve.cancelled() said so): a cancellation,
                # whatever it returned (kept as it is: a key's retry must not run it again).
                self._count_cancelled(RUNNING_STAGE)
        if self._figures is not None:
            self._figures.observe(self._name, HANDLER_DURATION, time.perf_counter() - started_at)
        raised = done.exception() if scope is not None and scope.trace is not None and not done.cancelled() else None
        if raised is not None:
            raised = what_was_raised(raised)  # (SystemExit in the span, not the HandlerExit carrying it)
        self._finish(entry_id, request, reply, scope=scope, error=raised)

    def _on_stream_done(
        self, entry_id: bytes, request: Request, started_at: float, stream: Stream, done: asyncio.Future[Reply]
    ) -> None:
        scope = self._running.pop(entry_id, None)
        if done.cancelled():  # stopping: the entry stays pending, to be claimed again
            self._leave_pending(entry_id)
            return
        if self._figures is not None:
            self._figures.observe(self._name, HANDLER_DURATION, time.perf_counter() - started_at)
        reply = done.result()
        if scope is not None and scope.trace is not None and self._spans is not None:
            self._spans.streamed(scope, reply.seq)  # the chunks sent (its final reply's seq)
        self._finish(entry_id, request, reply, stream.kept_reply(reply), scope=scope)

    def _leave_pending(self, entry_id: bytes) -> None:
        """Give up a request unanswered (the replica stops): its entry stays pending, to be claimed again."""
        self._made_under.pop(entry_id, None)
        self._shared_runs.pop(entry_id, None)
        self._slots.handler_returned()
        self._slots.finished([entry_id])

    def _finish(
        self,
        entry_id: bytes,
        request: Request,
        reply: Reply,
        kept: Reply | None = None,
        *,
        scope: RequestScope | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Free the request's slot and hand its reply to the Finisher (no reply when nobody waits for one).

        ``kept``: what a shared run keeps instead of ``reply`` (a stream's chunks with its end). ``scope``: the
        request's, which holds its handler span when the replica traces; ``error``: what the handler raised."""
        self._slots.handler_returned()
        self.served += 1
        outcome = reply.status
        answered = bool(request.reply_to)
        if outcome is not ReplyStatus.OK:
            if outcome is ReplyStatus.END:  # a stream that ended well
                outcome = ReplyStatus.OK
            elif outcome is ReplyStatus.CANCELLED:  # nobody waits for it: counted, not sent
                answered = False
                self._count_cancelled(reply.error_message)
            else:
                self.failed += 1
        if self._figures is not None:
            self._figures.count(self._name, HANDLED, outcome.value)
        if scope is not None and scope.trace is not None and self._spans is not None:
            self._spans.ended(entry_id, request, scope, reply, answered, error)
        settlement = None
        if request.run:  # a shared run ends (an idempotency key's, identical requests'): kept, or freed
            self._shared_runs.pop(entry_id, None)
            made_under = self._made_under.pop(entry_id, self.config) if request.cache else self.config
            if made_under is None:  # it ran beside a reconfigure(): kept under no config's digest
                settlement = settling.settle(self._keys, self.config, request, kept or reply, keep=False)
            else:
                settlement = settling.settle(self._keys, made_under, request, kept or reply)
        release: Command | None = None
        if request.held:  # its tenant's count of held requests is bounded: it no longer counts
            release = ("ZREM", self._keys.tenant_held(self._name, request.tenant), request.held)
        self._finisher.finish(
            entry_id, reply if answered else None, request.reply_to, request.deadline_ms, settlement, release
        )

    def _spans_acknowledged(self, refs: list[bytes]) -> None:
        """The Finisher's: ``refs`` are settled (their replies' spans end), then their slots are free."""
        assert self._spans is not None
        self._spans.acknowledged(refs)
        self._slots.finished(refs)

    def _count_cancelled(self, stage: str) -> None:
        if self._figures is not None:
            self._figures.count(self._name, CANCELLED, stage)

    def _reply_for(self, request: Request, done: asyncio.Future[Any]) -> Reply:
        raised = done.exception()
        if isinstance(raised, DeadlinePassed):
            return request.reply(ReplyStatus.DEADLINE_EXCEEDED, self._consumer)
        if raised is not None:
            return self._user_error(request, raised)
        try:
            body = dumps(done.result())
        except Exception as exc:  # the result has no exact JSON form
            return self._user_error(request, exc, "the handler's result cannot be sent as JSON: ")
        limit = self.config.max_response_bytes
        if len(body) > limit:  # never written to Redis
            return self._user_error(
                request,
                ResponseTooLargeError(
                    f"the handler's result is {len(body)} bytes of JSON, above max_response_bytes ({limit})"
                ),
            )
        return request.reply(ReplyStatus.OK, self._consumer, body=body)

    def _user_error(self, request: Request, exc: BaseException, context: str = "") -> Reply:
        """The reply to a request whose handler raised ``exc``; logged here at ERROR with its traceback (the reply
        carries the traceback only with STREAMSERVE_DEBUG=1). A RequestTimeoutError at the request's deadline is
        that deadline passing, not the handler's error: a child call's, whose deadline was the request's. It is
        counted and answered as the request's own deadline is, without a line."""
        exc = what_was_raised(exc)
        if isinstance(exc, RequestTimeoutError) and 0 < request.deadline_ms <= now_ms() + INHERITED_DEADLINE_SLACK_MS:
            self._count_cancelled(RUNNING_STAGE)
            return request.reply(ReplyStatus.DEADLINE_EXCEEDED, self._consumer)
        text = exception_text(exc)
        logger.error(
            "replica %s: the handler raised on request %s: %s%s: %s",
            self._consumer,
            request.request_id,
            context,
            type(exc).__name__,
            text,
            exc_info=exc,
            extra={
                "request_id": request.request_id,
                "deployment": self._name,
                "replica_id": self._consumer,
                **({"parent_request_id": request.parent} if request.parent else {}),
                **trace_context.log_ids(request),
            },
        )
        message = context + text
        if self._settings.debug:
            message += "\n" + "".join(traceback.format_exception(exc))
        return request.reply(
            ReplyStatus.USER_ERROR,
            self._consumer,
            error_type=type(exc).__name__,
            error_message=message,
        )


async def _refused_or_done(beat: Awaitable[None]) -> None:
    """Await a vouching beat (ReplicaHeartbeat.vouch). Redis full refuses it, and the scheduler's writes too (none
    can have written the replica off meanwhile): that is no reason to hold back what was read. Other errors raise."""
    try:
        await beat
    except Exception as exc:
        if not refuses_writes(exc):
            raise


def _note_keep_failure(sent: asyncio.Future[list[Any]]) -> None:
    """Log a KEEP_RUN that did not get through (the next sweep sends it again)."""
    if (error := failure_of(sent)) is not None:
        logger.warning("could not keep the record of a shared run whose handler runs past its deadline: %s", error)
