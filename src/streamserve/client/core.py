"""What every part of the asyncio client shares: settings, connections and their lifecycle, and where a name routes.

``AsyncClient`` is this core plus one mixin per job (``calls``, ``job_calls``,
``control_writes``, ``state_reads``). Each mixin subclasses ``ClientCore``, so
all of them see one typed set of fields, and a method found through the
mixins costs a call no more than one written on a single class.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import warnings
import weakref
from typing import NamedTuple, Self

import redis
import redis.asyncio as aioredis
from opentelemetry.trace import Tracer

from streamserve.client.cancels import Canceller
from streamserve.client.enqueue_cuts import EnqueueCuts
from streamserve.client.hot_entries import HitCounts, HotEntries
from streamserve.client.jobs import JobQueue, jobs_redis_url
from streamserve.client.reply_stream import ReplyStream
from streamserve.client.route_table import Route, RouteCache
from streamserve.metrics.definitions import CACHE_REQUESTS
from streamserve.runtime import tracing
from streamserve.runtime.farm_files import default_redis_hint, running_farm
from streamserve.runtime.settings import Settings, redis_url_problem
from streamserve.transport.connections import JOB_POOL_SIZE, RedisRefusals, async_redis, redacted, sync_redis
from streamserve.transport.pipelining import Pipeliner
from streamserve.wire.errors import ConfigError, PayloadTooLargeError, RedisUnavailableError, UnavailableError, shown
from streamserve.wire.ids import new_caller_id

# Why a client whose event loop ended under it (asyncio.run returned without its aclose()) cannot be used.
LOOP_ENDED = (
    "this AsyncClient was started on an event loop that has ended: close it before its loop ends "
    "(async with AsyncClient() as client: ...), or make one per loop; await client.aclose() lets it start again "
    "on the loop that runs now"
)
# Why a client that a forked child inherited, started, from its parent cannot be used there.
FORKED = (
    "this AsyncClient was started in the parent of this forked process, whose connections it holds: make an "
    "AsyncClient in the process that uses it (await client.aclose() here lets this one start anew)"
)

# Every AsyncClient of this process, for the fork hook (_orphan_in_child).
_CLIENTS: weakref.WeakSet[ClientCore] = weakref.WeakSet()
# What a forked child's AsyncClients had from the parent (connections, tasks), held for good and never used: their
# sockets and the loop's selector are shared with the parent, which a finalizer run here would close or change.
_INHERITED: list[object] = []


# What a client that was given no Redis, and found no farm, adds to its failure to reach the default one.
DEFAULT_REDIS_HINT = default_redis_hint(
    None, 'pass a Redis URL, Client("redis://HOST:PORT"), or set REDIS_URL, or run where `up` runs'
)


class ClientCore:
    """One client's settings and connections: the Redis pool, its reply stream, its routes, its jobs connection."""

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None) -> None:
        """``redis_url``, else the settings' (``REDIS_URL``), else that of the farm `streamserve up` runs from
        ``.streamserve`` here (as the CLI finds it), else redis://127.0.0.1:6379."""
        settings = settings or Settings.checked()
        fallback = ""
        if redis_url is None and settings.redis_url is None:
            if (farm := running_farm(None)) is not None:
                settings = farm.serving(settings)
            else:
                fallback = DEFAULT_REDIS_HINT
        elif redis_url is not None:
            if not isinstance(redis_url, str):
                raise ConfigError(f"redis_url: a Redis URL is a string, got {shown(redis_url)}")
            if (problem := redis_url_problem(redis_url)) is not None:  # (model_copy validates nothing)
                raise ConfigError(f"redis_url: {problem}")
            settings = settings.model_copy(update={"redis_url": redis_url})
        self._settings = settings
        settings.give_cluster_nodes()  # (STREAMSERVE_REDIS_CLUSTER_NODES: a program of the user's reads it here)
        self._keys = settings.keys
        self.caller_id = new_caller_id()
        self._refusals = RedisRefusals(settings.effective_redis_url, fallback)
        self._job_refusals = self._refusals  # the jobs' Redis, once known (see _job_queue)
        self._redis: aioredis.Redis | None = None
        self._replies: ReplyStream | None = None
        self._routes: RouteCache | None = None
        self._pipeliner: Pipeliner | None = None
        self._canceller: Canceller | None = None
        self._jobs: JobQueue | None = None
        self._jobs_redis: redis.Redis | None = None
        self._shadow_tasks: set[asyncio.Task[str]] = set()
        self._enqueue_cuts = EnqueueCuts()  # calls waiting for their enqueue, which their deadline cuts
        # Response-cache entries read lately, answering identical calls without Redis, and the hits they answered
        # (counted in Redis by _hits, made with the pipeliner).
        self._hot = HotEntries()
        self._hits: HitCounts | None = None
        self._start_lock: asyncio.Lock | None = None
        # Set by the blocking Client's close(): the client is not started again (see _close_for_good).
        self._closed_for_good = False
        # Why the client cannot be used until aclose(), its connections belonging to a loop that ended (``_orphan``).
        self._orphaned: str | None = None
        # Where its calls' enqueue spans come from (runtime/tracing.py), looked up when it starts: None, no spans.
        self._tracer: Tracer | None = tracing.tracer()
        # Closes what the client holds if it is garbage-collected without aclose() (see _close_if_dropped).
        self._dropped: weakref.finalize[..., ClientCore] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop its connections belong to, once connected
        _CLIENTS.add(self)

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Connect, load the deployments and make the reply stream (done by the first call if not before).

        On a Redis that is out of memory, connecting and loading still work (they write nothing), but the reply
        stream cannot be made: OverloadedError, and the next start (every call starts) tries again.
        """
        if self._replies is not None:
            return
        self._tracer = tracing.tracer()  # a provider the program set up after making the client
        # One hold of the lock for both steps: the calls that wait for a start go on in the order they were made (a
        # second wait for the lock put the first call behind the others, and their requests were queued out of
        # order).
        async with self._start_guard():
            await self._connect_locked()
            if self._replies is None:
                replies = ReplyStream(
                    self.redis, self._keys.reply_stream(self.caller_id), self.caller_id, self._refusals
                )
                with self._refusals:
                    await replies.create()
                self._replies = replies
                replies.start()
                self._close_if_dropped()

    async def _connect(self) -> None:
        """The connection pool and the routes (long-polled): what reads need, and what writes nothing."""
        if self._redis is not None:
            return
        async with self._start_guard():
            await self._connect_locked()

    async def _connect_locked(self) -> None:
        """``_connect``'s work; the caller holds the start lock (``_start_guard``)."""
        if self._redis is not None:
            return
        if self._closed_for_good:
            raise UnavailableError("client closed: this Client was closed (close()); make a new one")
        if self._orphaned is not None:
            raise RuntimeError(self._orphaned)
        redis = async_redis(self._settings.effective_redis_url)
        routes = RouteCache(redis, self._keys, self._refusals)
        try:
            with self._refusals:
                await routes.start()
        except BaseException:
            await redis.aclose()
            raise
        self._pipeliner = Pipeliner(redis)
        self._canceller = Canceller(redis, self._pipeliner, self._keys)
        self._hits = HitCounts(self._pipeliner, self._keys, CACHE_REQUESTS.field("hit"))
        self._redis, self._routes = redis, routes
        self._loop = asyncio.get_running_loop()
        me = weakref.ref(self)  # (not self: the long poll's task would keep a dropped client alive)

        def orphan() -> None:
            if (client := me()) is not None:
                client._orphan(LOOP_ENDED)

        routes.on_stop(orphan)
        self._close_if_dropped()

    def _held(self) -> _Held:
        return _Held(
            self._routes, self._replies, self._canceller, self._hits, self._pipeliner, self._redis, self._jobs_redis
        )

    def _close_if_dropped(self) -> None:
        """Have the collector close what the client holds now if the program drops it unclosed (made again as the
        client gets more). Each AsyncClient made and dropped without aclose() kept its tasks and four Redis
        connections for good: a program that made one per request ran Redis out of connections."""
        if self._dropped is not None:
            self._dropped.detach()
        self._dropped = weakref.finalize(self, _close_dropped, self._held(), self._loop, os.getpid())
        self._dropped.atexit = False  # at exit, nothing is left to leak

    def _start_guard(self) -> asyncio.Lock:
        """One start at a time (made on first use: it belongs to the loop that starts the client)."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        return self._start_lock

    async def _cancels_sent(self, within_s: float) -> None:
        """Wait (at most ``within_s``) for the cancellations of calls whose callers stopped waiting: the blocking
        Client's, before the KeyboardInterrupt that cut its wait goes on."""
        await asyncio.sleep(0)  # a call cancelled just now asks for its cancellation on its next step
        if self._canceller is not None:
            await self._canceller.sent(within_s)

    def _orphan(self, why: str, *, hold: bool = False) -> None:
        """Forget the connections and tasks of a loop that ended under the client, without closing them (which
        needs that loop): its next use raises RuntimeError(``why``), as their use on another loop raised a bare
        'Event loop is closed', then waited out its timeout for a reply reader that was gone. aclose() clears it.
        ``hold``: a forked child's, kept in _INHERITED (the jobs' connections too)."""
        self._orphaned = why
        if hold:
            _INHERITED.extend((self._redis, self._replies, self._routes, self._pipeliner, self._canceller))
            _INHERITED.extend((self._hits, self._jobs_redis, self._shadow_tasks))
            self._jobs_redis = self._jobs = None
            self._shadow_tasks = set()
        self._forget()
        self.caller_id = new_caller_id()  # a reply stream of its own: late replies to the old one are not its

    async def aclose(self) -> None:
        """Stop the reader, fail what is still waiting, drop the reply stream and disconnect. The client may be
        started again (``async with`` it once more, or call it): it connects anew, on whatever loop runs then."""
        if self._orphaned is not None:  # what it had is gone with its loop: nothing to close
            self._orphaned = None
            return
        try:
            await self._held().close()
        finally:
            # Nothing closed is used again, even when a close failed part-way (nor closed again by its finalizer): a
            # call after this starts the client anew (with its parts kept, it queued its request and waited out its
            # whole timeout, the reply reader gone). On a reply stream of its own: a call cut off here may still be
            # answered, and its late reply, matched by its tag (counted from 1 again by a new reader), would have
            # been taken for the answer of a new call.
            self._forget()
            self._jobs_redis = self._jobs = None
            self.caller_id = new_caller_id()

    def _forget(self) -> None:
        """Drop the parts bound to the loop the client ran on."""
        if self._dropped is not None:
            self._dropped.detach()
            self._dropped = None
        self._loop = None
        self._redis = self._replies = self._routes = self._pipeliner = self._canceller = self._hits = None
        self._start_lock = None  # (bound to the loop that used it)

    async def _close_for_good(self) -> None:
        """``aclose()``, after which the client is never started again: the blocking Client's close(), whose loop
        stops next. A call that reached the loop as it closed would otherwise connect anew on a loop about to stop,
        and wait there for ever."""
        self._closed_for_good = True
        await self.aclose()

    def _orphan_in_child(self) -> None:
        """In a forked child: a started client is unusable here (its next use says why); any client gets a caller id
        of its own, so that it never reads the parent's reply stream."""
        if self._redis is not None or self._jobs_redis is not None:
            self._orphan(FORKED, hold=True)
        else:
            self.caller_id = new_caller_id()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- shared by the mixins -----------------------------------------------------

    @property
    def redis(self) -> aioredis.Redis:
        """The connection pool, once started."""
        if self._redis is None:
            raise UnavailableError("client not started")
        return self._redis

    async def route(self, name: str, sticky: str = "", timeout: object = None) -> Route:
        """Where a request to ``name`` goes now (see RouteCache.route). ``timeout``: the call's own, which bounds
        the client's start too (start_within)."""
        if self._replies is None and timeout is not None:
            await self._start_within(timeout)
        else:
            await self.start()
        assert self._routes is not None
        return await self._routes.route(name, sticky)

    async def _start_within(self, timeout: object) -> None:
        """``start()``, bounded by a call's own ``timeout`` (a valid one; another is refused with the call): a Redis
        that does not answer (a host that drops packets, a plain port named by a rediss:// URL) held a call with
        ``timeout=2`` for the half minute of the connection's retries."""
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            await self.start()
            return
        try:
            async with asyncio.timeout(timeout):
                await self.start()
        except TimeoutError:
            raise RedisUnavailableError(
                f"cannot reach Redis at {redacted(self._settings.effective_redis_url)} within the call's timeout"
                f" ({timeout:g}s)"
            ) from None

    def _check_size(self, body: bytes) -> None:
        if len(body) > self._settings.max_request_bytes:
            raise PayloadTooLargeError(
                f"request body of {len(body)} bytes is above max_request_bytes ({self._settings.max_request_bytes})"
            )

    def _job_queue(self) -> JobQueue:
        """RQ is blocking: jobs get their own small blocking connection, used from worker threads."""
        if self._jobs is None:
            try:
                url = jobs_redis_url(self._settings)
            except ConfigError as exc:  # the farm's set-up, not the caller's request: 503 at the gateway
                raise UnavailableError(f"asynchronous jobs are not available: {exc}") from None
            self._jobs_redis = sync_redis(url, max_connections=JOB_POOL_SIZE)
            self._jobs = JobQueue(self._jobs_redis, self._keys, self._settings.job_result_ttl_s)
            self._job_refusals = RedisRefusals(url)
            self._close_if_dropped()
        return self._jobs


class _Held(NamedTuple):
    """What a started client holds that needs closing, in the order it is closed."""

    routes: RouteCache | None
    replies: ReplyStream | None
    canceller: Canceller | None
    hits: HitCounts | None
    pipeliner: Pipeliner | None
    redis: aioredis.Redis | None
    jobs_redis: redis.Redis | None

    async def close(self) -> None:
        if self.routes is not None:
            await self.routes.close()
        if self.replies is not None:
            await self.replies.close(UnavailableError("client closed while the call waited for its reply"))
        if self.canceller is not None:
            await self.canceller.aclose()  # the requests its callers stopped waiting for
        if self.hits is not None:
            self.hits.close()
        if self.pipeliner is not None:
            await self.pipeliner.aclose()  # shadow copies and sends in flight go out before the pool closes
        if self.redis is not None:
            await self.redis.aclose()
        if self.jobs_redis is not None:
            self.jobs_redis.close()


# The closings of dropped clients under way (a task nobody else references could be collected before it ends).
_CLOSING: set[asyncio.Task[None]] = set()


def _close_dropped(held: _Held, loop: asyncio.AbstractEventLoop | None, pid: int) -> None:
    """An AsyncClient garbage-collected without aclose(): what it held is closed on its loop, without waiting
    (this runs wherever the collector runs). Warned about (ResourceWarning), as an unclosed file is."""
    if pid != os.getpid():
        return  # a forked child's inheritance is the parent's to close (_INHERITED)
    if loop is None:
        if held.jobs_redis is not None:
            held.jobs_redis.close()
    else:

        def begin() -> None:
            task = loop.create_task(_close_quietly(held))
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)

        with contextlib.suppress(RuntimeError):  # its loop closed already: what it held went with it
            loop.call_soon_threadsafe(begin)
    # Last: under -W error the warning raises, and the close must be on its way by then.
    warnings.warn("streamserve.AsyncClient dropped without aclose(): closed now", ResourceWarning, stacklevel=2)


async def _close_quietly(held: _Held) -> None:
    with contextlib.suppress(Exception):  # (Redis away: nobody is left to tell)
        async with asyncio.timeout(5):
            await held.close()


def _orphan_inherited() -> None:
    """After os.fork(), in the child: every AsyncClient it inherited (attribute writes and new ids: no thread, no
    connection, so a subprocess's fork before its exec costs next to nothing)."""
    for client in list(_CLIENTS):
        client._orphan_in_child()


os.register_at_fork(after_in_child=_orphan_inherited)
