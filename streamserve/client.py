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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import redis
import redis.asyncio as aioredis

from streamserve import scripts
from streamserve.backoff import Backoff
from streamserve.config import MAX_TIMEOUT_S, AppConfig, DeploymentConfig, EndpointConfig, load_config
from streamserve.connection import RETRYABLE_ERRORS, async_redis, sync_redis
from streamserve.desired import DesiredState
from streamserve.errors import (
    BadRequestError,
    DeadLetterError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ProtocolError,
    RedisUnavailableError,
    RemoteError,
    RequestTimeoutError,
    UnavailableError,
)
from streamserve.goals import GoalStore
from streamserve.ids import new_caller_id, new_request_id
from streamserve.jobs import JobInfo, JobQueue
from streamserve.keys import CONSUMER_GROUP, ConfigKey
from streamserve.longpoll import EVERYTHING, LongPollSubscriber, OnChange
from streamserve.messages import (
    DeploymentHealthRecord,
    GoalRecord,
    Reply,
    ReplyStatus,
    Request,
    dumps,
    now_ms,
    text,
)
from streamserve.pipelining import BlockingReader, Pipeliner, Script
from streamserve.settings import Settings
from streamserve.states import DeploymentHealth
from streamserve.status import DeploymentStatus, StatusReader
from streamserve.traffic import TrafficPolicy

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Route:
    """Where one request goes: the deployment that answers it, and the shadows that get a copy."""

    deployment: DeploymentConfig
    shadows: tuple[DeploymentConfig, ...] = ()


REPLY_STREAM_TTL_S = 60
"""A caller's reply stream expires this long after its caller stops refreshing it (it died)."""
_WATCHED = frozenset({ConfigKey.DEPLOYMENTS, ConfigKey.ENDPOINTS, ConfigKey.DEPLOYMENT_STATUS})
REPLY_READ_COUNT = 1000
REPLY_BLOCK_MS = 1000
_READER_TASK = "streamserve-replies"
_READ_REPLIES = ("XREAD", "COUNT", REPLY_READ_COUNT, "BLOCK", REPLY_BLOCK_MS, "STREAMS")
_ENQUEUE = Script(scripts.ENQUEUE)


def _encode(body: Any) -> bytes:
    """The request body as JSON; BadRequestError (not a bare TypeError) for what JSON cannot hold."""
    try:
        return dumps(body)
    except TypeError as exc:
        raise BadRequestError(f"body is not JSON-serialisable: {exc}") from None


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
        self._reply_stream = self._keys.reply_stream(self.caller_id)
        self._redis: aioredis.Redis | None = None
        self._jobs: JobQueue | None = None
        self._jobs_redis: redis.Redis | None = None
        self._pipeliner: Pipeliner | None = None
        self._deployments: dict[str, DeploymentConfig] = {}
        self._endpoints: dict[str, TrafficPolicy] = {}
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._lookups: dict[str, asyncio.Future[TrafficPolicy | None]] = {}
        self._health: dict[str, DeploymentHealthRecord] = {}
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._longpoll: LongPollSubscriber | None = None
        self._start_lock: asyncio.Lock | None = None
        self._last_reply_id = b"0-0"
        self._generation = 0
        self._closing = False

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
            try:
                await self._create_reply_stream(redis)
                self._pipeliner = Pipeliner(redis)
                self._longpoll = LongPollSubscriber(redis, self._keys, _WATCHED.__contains__, self._reloader(redis))
                await self._longpoll.start()
            except RETRYABLE_ERRORS as exc:
                await redis.aclose()
                raise RedisUnavailableError(f"cannot reach Redis at {self._safe_url()}: {exc}") from exc
            self._redis = redis
            self._tasks = [
                asyncio.create_task(self._read_replies(), name=_READER_TASK),
                asyncio.create_task(self._keep_reply_stream(), name="streamserve-reply-keeper"),
            ]

    async def aclose(self) -> None:
        """Stop the reader, fail what is still waiting, drop the reply stream and disconnect."""
        self._closing = True
        if self._redis is not None:
            # Cancelling a blocked XREAD inside redis-py can stall; wake the reader with an entry instead.
            with contextlib.suppress(*RETRYABLE_ERRORS):
                await self._redis.xadd(self._reply_stream, {"wake": b""}, nomkstream=True)
        for task in self._tasks:
            if task.get_name() != _READER_TASK:
                task.cancel()
        if self._tasks:
            _done, stuck = await asyncio.wait(self._tasks, timeout=REPLY_BLOCK_MS / 1000 + 1)
            for task in stuck:
                task.cancel()
        self._tasks = []
        if self._longpoll is not None:
            await self._longpoll.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(UnavailableError("client closed"))
        if self._pipeliner is not None:
            await self._pipeliner.aclose()  # shadow copies and sends in flight go out before the pool closes
        if self._redis is not None:
            with contextlib.suppress(*RETRYABLE_ERRORS):
                await self._redis.delete(self._reply_stream)
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
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        self._pending[request_id] = fut
        timer = loop.call_later(timeout_s, self._expire, request_id, timeout_s)
        try:
            request = Request(request_id, self._reply_stream, now_ms() + int(timeout_s * 1000), body, method)
            await self._add(cfg, request)
            self._mirror(route, request)
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)

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
            self._jobs_redis = sync_redis(self._settings.effective_redis_url)
            self._jobs = JobQueue(self._jobs_redis, self._keys, self._settings.job_result_ttl_s)
        return self._jobs

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except RETRYABLE_ERRORS as exc:
            raise RedisUnavailableError(f"cannot reach Redis at {self._safe_url()}: {exc}") from exc

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
        return DesiredState(self.redis, self._keys)

    @property
    def redis(self) -> aioredis.Redis:
        """The connection pool, once started."""
        if self._redis is None:
            raise UnavailableError("client not started")
        return self._redis

    @property
    def generation(self) -> int:
        """Bumped each time the deployments are reloaded (cheap change detection for caches)."""
        return self._generation

    async def ping(self) -> None:
        """Raise unless Redis answers."""
        await self.start()
        await self.redis.ping()

    def deployment(self, name: str) -> DeploymentConfig:
        """The deployment's config as this client last saw it (long-polled)."""
        try:
            return self._deployments[name]
        except KeyError:
            raise NotFoundError(f"no deployment named {name!r}") from None

    def deployments(self) -> dict[str, DeploymentConfig]:
        """Every deployment this client knows of, by name."""
        return dict(self._deployments)

    def endpoints(self) -> dict[str, EndpointConfig]:
        """Every endpoint this client knows of, by name."""
        return {name: policy.endpoint for name, policy in self._endpoints.items()}

    # -- internals ------------------------------------------------------------

    async def route(self, name: str) -> Route:
        """Where a request to ``name`` goes now: the deployment itself, or an endpoint's pick by weight.

        Raises NotFoundError for an unknown name and UnavailableError when the
        deployment has no replica and cannot get one.
        """
        await self.start()
        policy = self._endpoints.get(name)
        if policy is None and name not in self._deployments:
            policy = await self._fetch(name)
        if policy is None:
            return Route(self._serviceable(name))
        shadows = tuple(self._deployments[s] for s in policy.shadows() if s in self._deployments)
        return Route(self._serviceable(policy.pick()), shadows)

    def _serviceable(self, name: str) -> DeploymentConfig:
        cfg = self.deployment(name)
        # An autoscaled deployment at 0 replicas is not refused: the request queues, and the scheduler starts a
        # replica as soon as it sees it (the group reads from id 0, so that replica finds it).
        if cfg.autoscaling_config is None and cfg.wanted_replicas() == 0:
            raise UnavailableError(f"deployment {name!r} is scaled to 0 replicas")
        health = self._health.get(name)
        if health is not None and health.health is DeploymentHealth.UNHEALTHY and health.running == 0:
            raise UnavailableError(f"deployment {name!r} has no running replica: {health.message}")
        return cfg

    async def _fetch(self, name: str) -> TrafficPolicy | None:
        """A cache miss may just be news the long poll has not brought yet: ask Redis before saying no.

        Caches what it finds; returns the endpoint's policy, or None for a deployment.
        Concurrent misses on one name share a single look-up.
        """
        lookup = self._lookups.get(name)
        if lookup is None:
            lookup = self._lookups[name] = asyncio.ensure_future(self._look_up(name))
            lookup.add_done_callback(lambda _: self._lookups.pop(name, None))
        return await asyncio.shield(lookup)

    async def _look_up(self, name: str) -> TrafficPolicy | None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._keys.deployments(), name)
            pipe.hget(self._keys.endpoints(), name)
            raw_deployment, raw_endpoint = await pipe.execute()
        if raw_deployment is not None:
            self._deployments = {**self._deployments, name: DeploymentConfig.from_json(raw_deployment)}
            self._generation += 1
            return None
        if raw_endpoint is None:
            raise NotFoundError(f"no deployment or endpoint named {name!r}")
        policy = TrafficPolicy(EndpointConfig.from_json(raw_endpoint))
        missing = sorted(policy.endpoint.deployments - set(self._deployments))
        if missing:
            found = await self.redis.hmget(self._keys.deployments(), missing)
            fresh = {d: DeploymentConfig.from_json(raw) for d, raw in zip(missing, found, strict=True) if raw}
            self._deployments = {**self._deployments, **fresh}
        self._endpoints = {**self._endpoints, name: policy}
        self._generation += 1
        return policy

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
        args: list[Any] = [cfg.max_queued_requests, CONSUMER_GROUP]
        for key, value in request.encode().items():
            args += [key, value]
        try:
            entry_id = await self._pipeliner.run_script(_ENQUEUE, [self._keys.requests(cfg.name)], args)
        except RETRYABLE_ERRORS as exc:
            raise RedisUnavailableError(f"cannot reach Redis at {self._safe_url()}: {exc}") from exc
        if entry_id == 0:
            raise OverloadedError(
                f"deployment {cfg.name!r} has {cfg.max_queued_requests} requests queued (max_queued_requests)"
            )

    def _expire(self, request_id: str, timeout_s: float) -> None:
        fut = self._pending.get(request_id)
        if fut is not None and not fut.done():
            fut.set_exception(RequestTimeoutError(f"no reply within {timeout_s:g}s (request {request_id})"))

    def _reloader(self, redis: aioredis.Redis) -> OnChange:
        async def reload(changed: set[str]) -> None:
            everything = EVERYTHING in changed
            if everything or ConfigKey.DEPLOYMENTS in changed:
                raw = await redis.hgetall(self._keys.deployments())
                self._deployments = {text(k): DeploymentConfig.from_json(v) for k, v in raw.items()}
                self._generation += 1
            if everything or ConfigKey.ENDPOINTS in changed:
                raw = await redis.hgetall(self._keys.endpoints())
                self._endpoints = {text(k): TrafficPolicy(EndpointConfig.from_json(v)) for k, v in raw.items()}
                self._generation += 1
            if everything or ConfigKey.DEPLOYMENT_STATUS in changed:
                raw = await redis.hgetall(self._keys.deployment_status())
                self._health = {text(k): DeploymentHealthRecord.decode(v) for k, v in raw.items()}

        return reload

    async def _create_reply_stream(self, redis: aioredis.Redis) -> None:
        # Replicas add replies with NOMKSTREAM, so a dead caller's expired stream is never recreated.
        entry_id = await redis.xadd(self._reply_stream, {"hello": self.caller_id})
        await redis.expire(self._reply_stream, REPLY_STREAM_TTL_S)
        self._last_reply_id = entry_id if isinstance(entry_id, bytes) else entry_id.encode()

    async def _keep_reply_stream(self) -> None:
        """Refresh the reply stream's expiry and trim what was read; recreate it after a Redis restart."""
        assert self._redis is not None
        while True:
            await asyncio.sleep(REPLY_STREAM_TTL_S / 3)
            try:
                if not await self._redis.expire(self._reply_stream, REPLY_STREAM_TTL_S):
                    await self._create_reply_stream(self._redis)
                else:
                    await self._redis.xtrim(self._reply_stream, minid=self._last_reply_id)
            except RETRYABLE_ERRORS as exc:
                logger.warning("reply stream upkeep failed: %s", exc)

    async def _read_replies(self) -> None:
        assert self._redis is not None
        reader = BlockingReader(self._redis)
        backoff = Backoff()
        try:
            while not self._closing:
                try:
                    command = (*_READ_REPLIES, self._reply_stream, self._last_reply_id)
                    batches = await reader.read(command, REPLY_BLOCK_MS)
                except RETRYABLE_ERRORS as exc:
                    delay = backoff.next()
                    logger.warning("reply reader lost Redis (%s); retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                for _stream, entries in batches:
                    for entry_id, fields in entries:
                        self._last_reply_id = entry_id
                        self._resolve_reply(fields)
        finally:
            await reader.aclose()

    def _resolve_reply(self, fields: dict[bytes, bytes]) -> None:
        if b"hello" in fields or b"wake" in fields:
            return
        try:
            reply = Reply.decode(fields)
        except ProtocolError as exc:
            logger.warning("dropping unreadable reply: %s", exc)
            return
        fut = self._pending.get(reply.request_id)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def _safe_url(self) -> str:
        url = self._settings.effective_redis_url
        scheme, sep, rest = url.partition("://")
        if "@" in rest:
            rest = "***@" + rest.split("@", 1)[1]
        return f"{scheme}{sep}{rest}"


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
