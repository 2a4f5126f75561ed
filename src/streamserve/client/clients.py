"""The producer side: enqueue requests on a deployment's stream and await replies.

``AsyncClient`` does the work on an asyncio loop; ``Client`` runs one on a
background thread and hands out ``concurrent.futures.Future`` objects. Each
client process has one reply stream and one reader task that resolves every
in-flight request: no per-request connection, no polling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson
import redis
import redis.asyncio as aioredis

from streamserve.client.jobs import JobInfo, JobQueue, jobs_redis_url
from streamserve.client.reply_stream import ReplyStream
from streamserve.client.route_table import Route, RouteCache
from streamserve.control.desired_state import DesiredState
from streamserve.control.goal_records import GoalStore
from streamserve.control.status import DeploymentStatus, StatusReader
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import JOB_POOL_SIZE, RedisRefusals, async_redis, is_cluster_client, sync_redis
from streamserve.transport.pipelining import Command, Pipeliner, Script
from streamserve.wire import scripts
from streamserve.wire.config import MAX_TIMEOUT_S, AppConfig, DeploymentConfig, EndpointConfig, load_config
from streamserve.wire.errors import (
    BadRequestError,
    ConfigError,
    DeadLetterError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
    UnavailableError,
)
from streamserve.wire.ids import new_caller_id, new_request_id
from streamserve.wire.json_values import dumps
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import (
    GoalRecord,
    Reply,
    ReplyStatus,
    Request,
    now_ms,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


_ENQUEUE = Script(scripts.ENQUEUE)
# The enqueue sent again after a lost connection: rare, so as EVAL with its source (no NOSCRIPT to handle).
_ENQUEUE_AGAIN = scripts.ENQUEUE_AGAIN


def _encode(body: Any) -> bytes:
    """The request body as JSON; BadRequestError (not a bare TypeError) for what JSON cannot hold."""
    try:
        return dumps(body)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"body cannot be sent as JSON: {exc}") from None


def _timeout_s(timeout: float | None, cfg: DeploymentConfig) -> float:
    """The caller's timeout, else the deployment's; BadRequestError unless it is a positive finite number."""
    timeout_s = cfg.request_timeout_s if timeout is None else timeout
    is_number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not is_number or not 0 < timeout_s <= MAX_TIMEOUT_S:  # the range test is false for NaN too
        raise BadRequestError(
            f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}, got {timeout_s!r}"
        )
    return timeout_s


def result_of(reply: Reply) -> Any:
    """The handler's return value, or the error the reply stands for."""
    if reply.status is ReplyStatus.OK:
        return orjson.loads(reply.body)
    raise error_of(reply)


def error_of(reply: Reply) -> Exception:
    """The exception a non-OK reply stands for."""
    if reply.status is ReplyStatus.DEADLINE_EXCEEDED:
        return RequestTimeoutError(f"request {reply.request_id} passed its deadline before a replica could run it")
    if reply.status is ReplyStatus.BAD_REQUEST:
        return BadRequestError(reply.error_message)
    if reply.status is ReplyStatus.DEAD_LETTER:
        return DeadLetterError(reply.error_type, reply.error_message, reply.replica_id)
    return RemoteError(reply.error_type, reply.error_message, reply.replica_id)


class AsyncClient:
    """Calls deployments through Redis from an asyncio program.

    >>> async with AsyncClient("redis://localhost:6379") as client:
    ...     await client.call("echo", {"x": 1})
    """

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        if redis_url is not None:
            settings = settings.model_copy(update={"redis_url": redis_url})
        self._settings = settings
        self._keys = settings.keys
        self.caller_id = new_caller_id()
        self._refusals = RedisRefusals(settings.effective_redis_url)
        self._redis: aioredis.Redis | None = None
        self._replies: ReplyStream | None = None
        self._routes: RouteCache | None = None
        self._pipeliner: Pipeliner | None = None
        self._jobs: JobQueue | None = None
        self._jobs_redis: redis.Redis | None = None
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._start_lock: asyncio.Lock | None = None

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create the reply stream and load the deployments (done by the first call if not before)."""
        if self._redis is not None:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._redis is not None:
                return
            redis = async_redis(self._settings.effective_redis_url)
            replies = ReplyStream(redis, self._keys.reply_stream(self.caller_id), self.caller_id, self._refusals)
            routes = RouteCache(redis, self._keys)
            try:
                with self._refusals:
                    await replies.create()
                    await routes.start()
            except BaseException:
                await redis.aclose()
                raise
            self._pipeliner = Pipeliner(redis)
            self._redis, self._replies, self._routes = redis, replies, routes
            replies.start()

    async def aclose(self) -> None:
        """Stop the reader, fail what is still waiting, drop the reply stream and disconnect."""
        if self._routes is not None:
            await self._routes.close()
        if self._replies is not None:
            await self._replies.close(UnavailableError("client closed"))
        if self._pipeliner is not None:
            await self._pipeliner.aclose()  # shadow copies and sends in flight go out before the pool closes
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        if self._jobs_redis is not None:
            self._jobs_redis.close()
            self._jobs_redis = self._jobs = None

    async def __aenter__(self) -> AsyncClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- what callers use ---------------------------------------------------------

    async def call(self, name: str, body: Any = None, *, timeout: float | None = None, method: str = "") -> Any:
        """Run deployment (or endpoint) ``name`` on ``body`` and return its result, or raise a StreamServeError."""
        reply = await self.request(name, _encode(body), timeout=timeout, method=method)
        return result_of(reply)

    def submit(
        self, name: str, body: Any = None, *, timeout: float | None = None, method: str = ""
    ) -> asyncio.Task[Any]:
        """Start a call and return a task that resolves to its result."""
        return asyncio.ensure_future(self.call(name, body, timeout=timeout, method=method))

    async def send(self, name: str, body: Any = None, *, timeout: float | None = None, method: str = "") -> str:
        """Enqueue without waiting for (or receiving) the result; return the request id."""
        encoded = _encode(body)
        self._check_size(encoded)
        route = await self.route(name)
        request = Request(
            new_request_id(),
            "",
            now_ms() + int(1000 * _timeout_s(timeout, route.deployment)),
            encoded,
            method,
        )
        await self._add(route.deployment, request)
        self._mirror(route, request)
        return request.request_id

    async def request(
        self,
        name: str | Route,
        body: bytes,
        *,
        timeout: float | None = None,
        method: str = "",
        request_id: str | None = None,
    ) -> Reply:
        """Send already-encoded JSON and return the raw Reply (the gateway's entry point).

        ``name`` is a deployment or endpoint name, or a Route already picked.
        ``timeout`` defaults to the deployment's ``request_timeout_s``; the
        replica skips the request if this deadline passes before it starts.
        """
        self._check_size(body)
        route = name if isinstance(name, Route) else await self.route(name)
        cfg = route.deployment
        timeout_s = _timeout_s(timeout, cfg)
        request_id = request_id or new_request_id()
        replies = self._replies
        assert replies is not None
        fut = replies.expect(request_id)
        timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, request_id, timeout_s)
        try:
            request = Request(request_id, replies.name, now_ms() + int(timeout_s * 1000), body, method)
            await self._add(cfg, request)
            self._mirror(route, request)
            return await fut
        finally:
            timer.cancel()
            replies.forget(request_id)

    # -- asynchronous jobs (RQ) ----------------------------------------------------

    async def submit_job(self, name: str, body: Any = None, *, timeout: float | None = None, method: str = "") -> str:
        """Queue a call of ``name`` as an asynchronous job; return the job id (see ``job``).

        The body is checked now (JSON, size, the name exists and can be
        served), the call runs later on a job worker, through the same request
        stream and replicas as ``call``. ``timeout`` bounds the call once it
        starts (default: the deployment's ``request_timeout_s``).
        """
        encoded = _encode(body)
        self._check_size(encoded)
        route = await self.route(name)
        call_timeout_s = _timeout_s(timeout, route.deployment)
        # RQ serialises with the standard json module: hand it what orjson made of the body, plain JSON types.
        plain = orjson.loads(encoded)
        jobs = self._job_queue()
        return await self._in_thread(
            lambda: jobs.enqueue(name, plain, method=method, timeout=timeout, call_timeout_s=call_timeout_s)
        )

    async def job(self, job_id: str) -> JobInfo:
        """A job's status, with its result once finished or its error once failed; NotFoundError after its TTL."""
        jobs = self._job_queue()
        return await self._in_thread(lambda: jobs.info(job_id))

    def _job_queue(self) -> JobQueue:
        """RQ is blocking: jobs get their own small blocking connection, used from worker threads."""
        if self._jobs is None:
            try:
                url = jobs_redis_url(self._settings)
            except ConfigError as exc:  # the farm's set-up, not the caller's request: 503 at the gateway
                raise UnavailableError(f"asynchronous jobs are not available: {exc}") from None
            self._jobs_redis = sync_redis(url, max_connections=JOB_POOL_SIZE)
            self._jobs = JobQueue(self._jobs_redis, self._keys, self._settings.job_result_ttl_s)
        return self._jobs

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        with self._refusals:
            return await asyncio.to_thread(fn)

    # -- control: desired-state writes are goals ----------------------------------

    async def deploy(self, config: AppConfig | str | Path) -> dict[str, str]:
        """Apply a config (object or YAML path); return {deployment: goal id} for what changed.

        Endpoints in the config are written too; they need no goal (callers see them at once).
        """
        app = config if isinstance(config, AppConfig) else load_config(config)
        await self.start()
        return (await self._desired().apply(app)).goals

    async def set_traffic(
        self, endpoint: str, traffic: dict[str, float], shadow: dict[str, float] | None = None
    ) -> EndpointConfig:
        """Create or change an endpoint's traffic weights (and shadows, unless None); every caller follows."""
        await self.start()
        return await self._desired().set_traffic(endpoint, traffic, shadow)

    async def scale(self, name: str, num_replicas: int) -> str | None:
        """Set a deployment's replica count; the goal id, or None if it already had that."""
        await self.start()
        return await self._desired().scale(name, num_replicas)

    async def delete(self, name: str) -> str:
        """Delete a deployment; the goal id."""
        await self.start()
        return await self._desired().delete(name)

    async def wait_for_goal(self, goal_id: str, timeout: float | None = None) -> GoalRecord:
        """Block until the goal is done; GoalFailedError says why it failed, RequestTimeoutError if it took too long."""
        await self.start()
        return await GoalStore(self.redis, self._keys).wait(goal_id, timeout)

    async def status(self) -> list[DeploymentStatus]:
        """Every deployment with its replicas and queue figures."""
        await self.start()
        return await StatusReader(self.redis, self._keys).status()

    def _desired(self) -> DesiredState:
        return DesiredState(self.redis, self._keys, self._settings.import_allow_list)

    @property
    def redis(self) -> aioredis.Redis:
        """The connection pool, once started."""
        if self._redis is None:
            raise UnavailableError("client not started")
        return self._redis

    @property
    def generation(self) -> int:
        """Bumped each time the deployments are reloaded (cheap change detection for caches)."""
        return 0 if self._routes is None else self._routes.generation

    @property
    def routes_loaded(self) -> bool:
        """Whether the deployments and endpoints have been loaded (the client has started)."""
        return self._routes is not None

    async def ping(self) -> None:
        """Raise unless Redis answers."""
        await self.start()
        with self._refusals:
            await self.redis.ping()

    def deployment(self, name: str) -> DeploymentConfig:
        """The deployment's config as this client last saw it (long-polled)."""
        if self._routes is None:
            raise NotFoundError(f"no deployment named {name!r}")
        return self._routes.deployment(name)

    def deployments(self) -> dict[str, DeploymentConfig]:
        """Every deployment this client knows of, by name."""
        return {} if self._routes is None else self._routes.deployments()

    def endpoints(self) -> dict[str, EndpointConfig]:
        """Every endpoint this client knows of, by name."""
        return {} if self._routes is None else self._routes.endpoints()

    # -- internals ------------------------------------------------------------

    async def route(self, name: str) -> Route:
        """Where a request to ``name`` goes now (see RouteCache.route)."""
        await self.start()
        assert self._routes is not None
        return await self._routes.route(name)

    def _check_size(self, body: bytes) -> None:
        if len(body) > self._settings.max_request_bytes:
            raise PayloadTooLargeError(
                f"request body of {len(body)} bytes is above max_request_bytes ({self._settings.max_request_bytes})"
            )

    def _mirror(self, route: Route, request: Request) -> None:
        """Send a copy of an admitted request to each shadow, without a reply stream (no one waits for it)."""
        for shadow in route.shadows:
            copy = Request(new_request_id(), "", request.deadline_ms, request.body, request.method)
            task = asyncio.create_task(self._add(shadow, copy))
            self._shadow_tasks.add(task)
            task.add_done_callback(self._shadow_sent)

    def _shadow_sent(self, task: asyncio.Task[None]) -> None:
        self._shadow_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A shadow must never hurt live traffic: a full or missing shadow queue only costs its copy.
            logger.debug("shadow copy not sent: %s", task.exception())

    async def _add(self, cfg: DeploymentConfig, request: Request) -> None:
        assert self._pipeliner is not None
        stream = self._keys.requests(cfg.name)
        args: list[Any] = [cfg.max_queued_requests, CONSUMER_GROUP]
        for key, value in request.encode().items():
            args += [key, value]

        def again() -> list[Command]:
            """The enqueue may have happened, its answer lost with the connection: it must not add the request
            twice, and need not at all once the caller has its reply (or stopped waiting)."""
            if request.reply_to and self._replies is not None and not self._replies.waits_for(request.request_id):
                return [("ECHO", b"answered")]
            keys = [stream] if not request.reply_to or is_cluster_client(self.redis) else [stream, request.reply_to]
            return [("EVAL", _ENQUEUE_AGAIN, len(keys), *keys, *args[:2], request.request_id, *args[2:])]

        with self._refusals:
            entry_id = await self._pipeliner.run_script(_ENQUEUE, [stream], args, again)
        if entry_id == 0:
            raise OverloadedError(
                f"deployment {cfg.name!r} has {cfg.max_queued_requests} requests queued (max_queued_requests)"
            )

    def _expire(self, request_id: str, timeout_s: float) -> None:
        if self._replies is not None:
            error = RequestTimeoutError(f"no reply within {timeout_s:g}s (request {request_id})")
            self._replies.fail(request_id, error)


class Client:
    """The blocking client: the same calls as AsyncClient, run on a background event loop.

    >>> client = Client("redis://localhost:6379")
    >>> client.call("echo", {"x": 1}, timeout=5)
    """

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None) -> None:
        self._async = AsyncClient(redis_url, settings=settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamserve-client", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise UnavailableError("client closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, name: str, body: Any = None, *, timeout: float | None = None, method: str = "") -> Any:
        """Run deployment ``name`` on ``body`` and return its result, or raise a StreamServeError."""
        return self.submit(name, body, timeout=timeout, method=method).result()

    def submit(
        self, name: str, body: Any = None, *, timeout: float | None = None, method: str = ""
    ) -> concurrent.futures.Future[Any]:
        """Start a call; the Future resolves to its result or raises its error."""
        return self._run(self._async.call(name, body, timeout=timeout, method=method))

    def send(self, name: str, body: Any = None, *, timeout: float | None = None, method: str = "") -> str:
        """Enqueue without waiting for the result; return the request id."""
        return self._run(self._async.send(name, body, timeout=timeout, method=method)).result()

    def submit_job(self, name: str, body: Any = None, *, timeout: float | None = None, method: str = "") -> str:
        """Queue a call of ``name`` as an asynchronous job; return the job id (see ``job``)."""
        return self._run(self._async.submit_job(name, body, timeout=timeout, method=method)).result()

    def job(self, job_id: str) -> JobInfo:
        """A job's status, with its result once finished or its error once failed; NotFoundError after its TTL."""
        return self._run(self._async.job(job_id)).result()

    def deploy(self, config: AppConfig | str | Path) -> dict[str, str]:
        """Apply a config (object or YAML path); return {deployment: goal id} for what changed."""
        return self._run(self._async.deploy(config)).result()

    def scale(self, name: str, num_replicas: int) -> str | None:
        """Set a deployment's replica count; the goal id, or None if it already had that."""
        return self._run(self._async.scale(name, num_replicas)).result()

    def delete(self, name: str) -> str:
        """Delete a deployment; the goal id."""
        return self._run(self._async.delete(name)).result()

    def set_traffic(
        self, endpoint: str, traffic: dict[str, float], shadow: dict[str, float] | None = None
    ) -> EndpointConfig:
        """Create or change an endpoint's traffic weights (and shadows, unless None); every caller follows."""
        return self._run(self._async.set_traffic(endpoint, traffic, shadow)).result()

    def wait_for_goal(self, goal_id: str, timeout: float | None = None) -> GoalRecord:
        """Block until the goal is done; GoalFailedError says why it failed, RequestTimeoutError if it took too long."""
        return self._run(self._async.wait_for_goal(goal_id, timeout)).result()

    def status(self) -> list[DeploymentStatus]:
        """Every deployment with its replicas and queue figures."""
        return self._run(self._async.status()).result()

    def deployments(self) -> dict[str, DeploymentConfig]:
        """Every deployment the client knows of (connects if needed)."""
        self._run(self._async.start()).result()
        return self._async.deployments()

    def close(self) -> None:
        """Disconnect and stop the background loop."""
        if self._closed:
            return
        with contextlib.suppress(Exception):
            self._run(self._async.aclose()).result(timeout=5)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
