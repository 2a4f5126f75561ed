"""Redis connections built one way, with one retry policy shared by every process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode
from redis.connection import (
    FALSE_STRINGS,
    URL_QUERY_ARGUMENT_PARSERS,
    BlockingConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
    to_bool,
)
from redis.connection import Connection as SyncConnection
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    ExecAbortError,
    InvalidResponse,
    MasterDownError,
    MovedError,
    NoPermissionError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from streamserve.transport.cluster_nodes import found_by, known_nodes
from streamserve.wire.errors import ConfigError, OverloadedError, RedisUnavailableError, StreamServeError

# Errors worth retrying: the connection, not the command, failed; or a Redis Cluster is failing over or resharding.
# The cluster's refusals (CLUSTERDOWN, TRYAGAIN, MOVED, ASK, MASTERDOWN: the command did not run) are ResponseErrors
# to redis-py: a loop that tells a failed command from Redis away must test for these first.
RETRYABLE_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionResetError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
    MovedError,
    AskError,
    MasterDownError,
)

RETRY_ATTEMPTS = 5
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0

T = TypeVar("T")
C = TypeVar("C", bound=AbstractConnection)

# Who runs the retry loop under way (an asyncio task, or a thread's id): a loop that it starts inside it tries once.
_NOBODY = object()
_RETRYING: ContextVar[object] = ContextVar("streamserve_retrying", default=_NOBODY)
# Set once the farm this process belongs to is gone (stop_retrying): from then on every operation tries once.
_GIVEN_UP = threading.Event()


def stop_retrying() -> None:
    """Make every Redis operation of this process, from now on, a single attempt.

    For a process whose `streamserve up` died: its Redis has most likely gone with it, nobody will restart either,
    and each operation of its way out (the last replies, heartbeats, goodbyes) would otherwise spend the retry
    policy's 1-2 s on a Redis that is not coming back. A Redis that is still there (not `up`'s own) answers as before.
    """
    _GIVEN_UP.set()


def retrying_stopped() -> bool:
    """Whether stop_retrying() was called in this process (loops of their own, such as a cancellation's, give up)."""
    return _GIVEN_UP.is_set()


class PlainRedisAtTLSPort(RedisConnectionError):
    """A rediss:// URL names a port where Redis speaks no TLS: no attempt mends it (UNMENDABLE_ERRORS). Each waited
    out its TLS handshake, and the retries made it 34-72 s before any word."""


# Errors that end the retry loops below at their first attempt (once the failure handler has closed the connection).
# redis-py counts an AuthenticationError a connection error, worth another attempt after a backoff, but no attempt
# mends a wrong password: one took 0.5-1.8 s to be reported, past the gateway's 2 s probe on a busy machine.
UNMENDABLE_ERRORS: tuple[type[Exception], ...] = (AuthenticationError, PlainRedisAtTLSPort)
# How long the look at whether a port whose TLS handshake timed out speaks plain Redis may take.
PLAIN_LOOK_S = 1.0


def _unmendable(error: BaseException) -> bool:
    """Whether ``error``, or the error it was raised from (redis-py wraps what a connect raised), is unmendable."""
    return isinstance(error, UNMENDABLE_ERRORS) or isinstance(error.__cause__, UNMENDABLE_ERRORS)


def _plain_redis_said(answer: bytes) -> bool:
    """Whether ``answer`` to a plain-text PING is Redis's (+PONG, or an error such as -NOAUTH)."""
    return answer.startswith((b"+", b"-"))


def _plain_port_error(host: str, port: int) -> PlainRedisAtTLSPort:
    return PlainRedisAtTLSPort(
        f"the server at {host}:{port} speaks plain Redis, not TLS: its URL starts with redis://, not rediss://"
    )


def _speaks_plain_redis(host: str, port: int) -> bool:
    """Whether the server at ``host``:``port`` answers a plain-text PING as Redis does (at most PLAIN_LOOK_S)."""
    try:
        with socket.create_connection((host, port), timeout=PLAIN_LOOK_S) as sock:
            sock.sendall(b"PING\r\n")
            return _plain_redis_said(sock.recv(16))
    except OSError:
        return False


async def _speaks_plain_redis_async(host: str, port: int) -> bool:
    """_speaks_plain_redis, on the event loop."""
    writer = None
    try:
        async with asyncio.timeout(PLAIN_LOOK_S):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"PING\r\n")
            return _plain_redis_said(await reader.read(16))
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()


class OutermostRetry(Retry):
    """The shared retry policy (blocking connections), applied once per operation: see OutermostAsyncRetry."""

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any], *args: Any, **kwargs: Any) -> T:
        owner = threading.get_ident()
        if _RETRYING.get() == owner or _GIVEN_UP.is_set():
            return Retry(NoBackoff(), 0, _errors(self)).call_with_retry(do, fail, *args, **kwargs)
        token = _RETRYING.set(owner)

        def fail_once(error: Exception, *count: int) -> Any:
            fail(error, *count)
            if _unmendable(error):
                raise error

        try:
            return super().call_with_retry(do, fail_once, *args, **kwargs)
        finally:
            _RETRYING.reset(token)


class OutermostAsyncRetry(AsyncRetry):
    """The shared retry policy, applied once per operation: a retry loop started inside another one (in the same
    task) makes a single attempt, and the outer loop does the waiting.

    redis-py reconnects a lost connection with the connection's own retry policy, from inside the retry loop of
    the command that found it lost (and so does Pipeliner's round trip). Nested, the two multiplied: the first
    command after Redis died made up to 36 attempts and waited 6-10 s, not about 1.5 s, before it failed.
    """

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> T:
        owner = asyncio.current_task()
        if _RETRYING.get() is owner or _GIVEN_UP.is_set():
            return await AsyncRetry(NoBackoff(), 0, _errors(self)).call_with_retry(do, fail, *args, **kwargs)
        token = _RETRYING.set(owner)

        async def fail_once(error: Exception, *count: int) -> Any:
            await fail(error, *count)
            if _unmendable(error):
                raise error

        try:
            return await super().call_with_retry(do, fail_once, *args, **kwargs)
        finally:
            _RETRYING.reset(token)


def _errors(retry: Retry | AsyncRetry) -> tuple[Any, ...]:
    """The errors ``retry`` retries (a connection adds its ``retry_on_error`` to them)."""
    return retry._supported_errors


# Connections one asyncio client opens at most; more concurrent commands wait for a free one.
def _quiet_handshake() -> dict[str, Any]:
    """Connection options that keep redis-py from sending optional CLIENT commands on every connect.

    CLIENT SETINFO is Redis 7.2+ (older servers count a failed call each time) and redis-py 8's
    CLIENT MAINT_NOTIFICATIONS is for Redis Enterprise; an ACL user confined to the farm's commands
    (docs/operations.md, "Security") cannot be granted either on Redis 7.0. The option names depend on the
    redis-py version: driver_info replaced lib_name/lib_version (deprecated) in redis-py 8.
    """
    params = inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    options: dict[str, Any] = (
        {"driver_info": None} if "driver_info" in params else {"lib_name": None, "lib_version": None}
    )
    if "maint_notifications_config" in params:
        from redis.maint_notifications import MaintNotificationsConfig

        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return options


QUIET_HANDSHAKE = _quiet_handshake()

JOB_POOL_SIZE = 4  # connections a client's asynchronous-job calls (RQ, blocking, on threads) open at most
POOL_SIZE = 64
# A Redis Cluster client's connections to each node, at most. redis-py's cluster client fails a command rather than
# wait for a free one, so this is far above what a process uses at once.
CLUSTER_NODE_CONNECTIONS = 1024
# How long a command waits for a free connection before it counts as Redis being unavailable.
POOL_WAIT_S = 20.0


# How long a new connection may take to be made, its TLS handshake included: a rediss:// URL given the port of a
# Redis that speaks no TLS got no answer to its handshake, and waited (a job worker for good, the rest 30-70 s).
CONNECT_TIMEOUT_S = 5.0


def _options(retry: Retry | AsyncRetry) -> dict[str, Any]:
    """What every connection of every process shares: bytes replies, the retry policy, a quiet handshake, a bound on
    connecting."""
    return {
        "decode_responses": False,
        "retry": retry,
        "retry_on_error": list(RETRYABLE_ERRORS),
        "health_check_interval": 30,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        **QUIET_HANDSHAKE,
    }


class _BoundedTLSConnection(SSLConnection):
    """redis-py's blocking TLS connection, its handshake bounded by the connect timeout: redis-py makes it under the
    socket timeout, which the blocking clients leave unset (RQ's reads block for minutes)."""

    def _wrap_socket_with_ssl(self, sock: socket.socket) -> Any:
        sock.settimeout(self.socket_connect_timeout)
        try:
            wrapped = super()._wrap_socket_with_ssl(sock)  # type: ignore[no-untyped-call]
        except TimeoutError:  # (socket.timeout) no TLS hello came back: a plain Redis waits for a command
            if _speaks_plain_redis(self.host, self.port):
                raise _plain_port_error(self.host, self.port) from None
            raise
        wrapped.settimeout(self.socket_timeout)
        return wrapped


# How long a one-shot look at Redis may take (is it a cluster, does it keep its data, may its user do what the farm
# does, a worker's last look on its way out): no process's start or exit waits on one for long.
ONE_SHOT_TIMEOUT_S = 1.0


def one_shot_redis(url: str, *, decode_responses: bool = False) -> redis.Redis:
    """A blocking client for one look at the Redis at ``url``: it answers within ONE_SHOT_TIMEOUT_S or not at all
    (one attempt, no retries)."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=ONE_SHOT_TIMEOUT_S,
        socket_timeout=ONE_SHOT_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        decode_responses=decode_responses,
        **QUIET_HANDSHAKE,
    )


def is_cluster(url: str) -> bool:
    """Whether the Redis at ``url`` runs in cluster mode (INFO: ``cluster_enabled:1``), asked once per process.

    A Redis that cannot be asked (unreachable after the retry policy, or an ACL user denied INFO) counts as a
    single server, as before cluster support: the process then reports the outage itself.
    """
    known = _CLUSTER_URLS.get(url)
    if known is None:
        # The URL's node first, then any other node this process was given (cluster_nodes): the URL's may be down.
        for node_url in [url, *(_url_at(url, host, port) for host, port in known_nodes(url))]:
            known = _probe_cluster(node_url)
            if known is not None:
                break
        else:
            return False  # not remembered: a later client asks again
        _CLUSTER_URLS[url] = known
    return known


def _probe_cluster(url: str) -> bool | None:
    """Whether the node at ``url`` runs in cluster mode; None when it cannot be reached."""
    probe = one_shot_redis(url)  # (it runs where the client is made, maybe on an event loop)
    try:
        return str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
    except RETRYABLE_ERRORS:
        return None
    except redis.RedisError:
        return False  # INFO refused: only single servers are run with users that may not ask it
    finally:
        probe.close()


def _url_at(url: str, host: str, port: int) -> str:
    """``url`` with another node's address in it (the same user, password and options)."""
    parts = urllib.parse.urlsplit(url)
    user, at, _address = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}{at}{address}"))


_CLUSTER_URLS: dict[str, bool] = {}


def is_cluster_client(client: object) -> bool:
    """Whether ``client`` (from async_redis or sync_redis) talks to a Redis Cluster."""
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


async def refresh_cluster_map(client: aioredis.Redis) -> None:
    """After a lost connection on a Redis Cluster, re-read which master owns which slot (a failover may have
    moved them). Commands do this by themselves; a pub/sub subscription, which is not a command, needs it."""
    if isinstance(client, aioredis.RedisCluster):
        with contextlib.suppress(*RETRYABLE_ERRORS, redis.RedisClusterException):
            await client.nodes_manager.initialize()


def _cluster_options(url: str, retry: Retry | AsyncRetry, node: type[Any]) -> dict[str, Any]:
    """A cluster client's options: the shared ones, with the retry policy applied by the cluster client itself
    (which also follows MOVED and ASK redirections and re-reads the slot map after a failover), and every node of
    the cluster this process knows besides the URL's (cluster_nodes) to start from as ``node``s."""
    options = _options(retry)
    del options["retry_on_error"]  # the cluster client retries its own ERRORS_ALLOW_RETRY
    startup_nodes = [node(host, port) for host, port in known_nodes(url)]
    return {**options, "max_connections": CLUSTER_NODE_CONNECTIONS, "startup_nodes": startup_nodes}


def async_redis(url: str, *, max_connections: int = POOL_SIZE) -> aioredis.Redis:
    """An asyncio client (bytes replies) with the shared retry policy.

    The pool blocks when all its connections are busy: redis-py's default
    pool raises instead, which would fail a caller that merely has many
    requests in flight.

    On a Redis Cluster it is a ``RedisCluster``, typed as ``Redis``: it takes the same commands, routed by key
    (every deployment's keys share one hash tag, the farm-wide ones another, see keys.py).
    """
    retry = OutermostAsyncRetry(ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S), RETRY_ATTEMPTS)
    if is_cluster(url):
        cluster = aioredis.RedisCluster.from_url(url, **_cluster_options(url, retry, AsyncClusterNode))
        _guard_cluster_connections(cluster)
        found_by(url, cluster.nodes_manager)
        return cast(aioredis.Redis, cluster)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=POOL_WAIT_S, **_options(retry)
    )
    pool.connection_class = guarded_connection(pool.connection_class)
    return aioredis.Redis.from_pool(pool)


def _guard_cluster_connections(cluster: aioredis.RedisCluster) -> None:
    """Make every connection ``cluster`` opens a guarded_connection. It opens them lazily, so this is in time; its
    node template's class is the one nodes found later get, and its startup nodes took theirs already."""
    template = cluster.nodes_manager.connection_kwargs
    template["connection_class"] = guarded_connection(template.get("connection_class", Connection))
    for node in cluster.nodes_manager.startup_nodes.values():
        node.connection_class = guarded_connection(node.connection_class)


_GUARDED: dict[type[AbstractConnection], type[AbstractConnection]] = {}
# Python 3.11's asyncio.wait_for, which redis-py writes with when a connection has a socket timeout, returns the
# result of a write that completed as its task was being cancelled, and the cancellation is lost (3.12 fixed it).
_WAIT_FOR_LOSES_CANCELS = sys.version_info < (3, 12)


def guarded_connection(base: type[C]) -> type[C]:
    """``base`` (TCP, TLS or Unix socket), with two of redis-py's ways to fail a caller mended.

    - A write to a transport that Redis closed under it raises redis-py's ConnectionError, which the retry policy
      retries and callers report as Redis unavailable. On uvloop such a write raises RuntimeError ("the handler is
      closed"), which redis-py passes on as it is: a Redis killed while a connection was being opened or written to
      then answered the caller 500.
    - On Python 3.11, a task cancelled while it writes a command is cancelled (see _WAIT_FOR_LOSES_CANCELS): a lost
      cancellation left a client's reply reader running, and ``asyncio.run`` of a program that never closed its
      AsyncClient waiting for it for ever.
    """
    guarded = _GUARDED.get(base)
    if guarded is None:

        class Guarded(base):  # type: ignore[valid-type,misc]
            async def _connect(self) -> None:
                try:
                    await super()._connect()
                except TimeoutError:  # (asyncio's) no TLS hello came back: a plain Redis waits for a command
                    connection = cast(Any, self)
                    if isinstance(self, aioredis.SSLConnection) and await _speaks_plain_redis_async(
                        connection.host, connection.port
                    ):
                        raise _plain_port_error(connection.host, connection.port) from None
                    raise

            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                try:
                    if _WAIT_FOR_LOSES_CANCELS and cast(AbstractConnection, self).socket_timeout:
                        await self._send_within_timeout(command, check_health)
                    else:
                        await super().send_packed_command(command, check_health)
                except RuntimeError as exc:
                    if not _is_closed_transport(exc):
                        raise
                    await self.disconnect(nowait=True)
                    raise RedisConnectionError(f"connection to Redis lost while writing: {exc}") from exc

            async def _send_within_timeout(self, command: Any, check_health: bool) -> None:
                """redis-py's write bounded by asyncio.timeout, which passes a cancellation on, not by wait_for."""
                connection = cast(AbstractConnection, self)
                socket_timeout, connection.socket_timeout = connection.socket_timeout, None
                try:
                    async with asyncio.timeout(socket_timeout):
                        await super().send_packed_command(command, check_health)
                except TimeoutError:
                    raise RedisTimeoutError("Timeout writing to socket") from None  # disconnected, as redis-py does
                finally:
                    connection.socket_timeout = socket_timeout

        Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
        guarded = _GUARDED[base] = Guarded
    return cast(type[C], guarded)


def _is_closed_transport(exc: RuntimeError) -> bool:
    # uvloop's words (uvloop/handles/handle.pyx, _ensure_alive); asyncio's own transports do not raise here.
    return "handler is closed" in str(exc)


def sync_redis(url: str, *, max_connections: int | None = None) -> redis.Redis:
    """A blocking client (bytes replies) with the shared retry policy, for the CLI, RQ and job calls.

    With ``max_connections``, a thread that finds them all busy waits for one (up to POOL_WAIT_S).
    """
    retry = OutermostRetry(ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S), RETRY_ATTEMPTS)
    if is_cluster(url):
        cluster = redis.RedisCluster.from_url(url, **_cluster_options(url, retry, ClusterNode))
        found_by(url, cluster.nodes_manager)
        return cast(redis.Redis, cluster)
    options = _options(retry)
    if url.strip().lower().startswith("rediss:"):
        options["connection_class"] = _BoundedTLSConnection
    if max_connections is None:
        return redis.Redis.from_url(url, **options)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=POOL_WAIT_S, **options)
    return redis.Redis.from_pool(pool)


def redacted(url: str) -> str:
    """The URL with any user and password replaced by ``***``, for messages and logs: the ``user:password@`` before
    its host (up to the last ``@``: redis-py takes a password with an ``@`` in it as it is) and a ``password=`` of
    its query (how a unix:// URL gives one)."""
    scheme, sep, rest = url.partition("://")
    address, question, query = rest.partition("?")
    if "@" in address:
        address = "***@" + address.rpartition("@")[2]
    if question:
        query = _QUERY_PASSWORD.sub(r"\1=***", query)
    return f"{scheme}{sep}{address}{question}{query}"


_QUERY_PASSWORD = re.compile(r"(?<![^&])(password)=[^&]*", re.IGNORECASE)


def refuses_writes(exc: BaseException) -> bool:
    """Whether Redis refused a write it would take once it has room again: it is out of memory (maxmemory reached
    with the noeviction policy), or it cannot write its persistence files (MISCONF: a full disk, say)."""
    # redis-py raises OutOfMemoryError for a plain command or a transaction; inside a Lua script the refusal
    # arrives as "Error running script ... -OOM command not allowed ...". A transaction that held a refused command
    # is discarded as a whole (EXECABORT): redis-py raises the refusal itself, from the ExecAbortError.
    if isinstance(exc, ExecAbortError):
        return any(refuses_writes(cause) for cause in (exc.__cause__, exc.__context__) if cause is not None)
    return isinstance(exc, OutOfMemoryError) or (
        isinstance(exc, ResponseError) and any(sign in str(exc) for sign in _REFUSED_WRITE_SIGNS)
    )


# How Redis refuses a write for lack of memory, and for a persistence file it cannot write.
_REFUSED_WRITE_SIGNS = ("OOM command not allowed", "MISCONF")


async def ping(client: aioredis.Redis) -> None:
    """PING: raises unless Redis answers. A Redis that cannot write its persistence files refuses PING too (MISCONF,
    so that a monitor sees it), and answers all the same."""
    try:
        await client.ping()
    except ResponseError as exc:
        if "MISCONF" not in str(exc):
            raise


def ping_sync(client: redis.Redis) -> None:
    """``ping`` for a synchronous client."""
    try:
        client.ping()
    except ResponseError as exc:
        if "MISCONF" not in str(exc):
            raise


# Why Redis refuses writes, in words for a message (why_writes_refused).
OUT_OF_MEMORY = "it is out of memory (maxmemory)"
CANNOT_PERSIST = "it cannot write its persistence files (is its disk full?)"


def why_writes_refused(exc: BaseException) -> str:
    """Why Redis refuses writes (``exc``: refuses_writes)."""
    if "MISCONF" in str(exc) or "MISCONF" in str(exc.__cause__ or exc.__context__ or ""):
        return CANNOT_PERSIST
    return OUT_OF_MEMORY


class WriteRefusals:
    """Tells once per episode that Redis refuses writes (refuses_writes), and once that it takes them again.

    For the loops that carry on through a full Redis (the scheduler's tick, a job worker's commands, a gateway's
    metrics): a line per refused write would repeat every tick for as long as Redis stays full. A Redis whose memory
    hovers at its limit refuses and takes writes by turns: an episode that starts within QUIET_S of the last one told
    is not told, nor is its end.
    """

    QUIET_S = 60.0

    def __init__(self, logger: logging.Logger, who: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._who = who
        self._clock = clock
        self.full = False  # within an episode: the last write was refused
        self._told = False  # the episode under way was told
        self._told_at = -self.QUIET_S

    def refused(self, exc: BaseException) -> bool:
        """Whether ``exc`` is Redis refusing a write (refuses_writes); the first of an episode is logged."""
        if not refuses_writes(exc):
            return False
        if not self.full:
            self.full = True
            self._told = self._clock() - self._told_at >= self.QUIET_S
            if self._told:
                self._told_at = self._clock()
                self._logger.warning(
                    "%s: Redis refuses writes, %s: %s; carrying on, and trying again",
                    self._who,
                    why_writes_refused(exc),
                    exc,
                )
        return True

    def accepted(self) -> None:
        """A write went through: the episode, if one was on, is over."""
        if self.full:
            self.full = False
            if self._told:
                self._logger.info("%s: Redis takes writes again", self._who)


class OutageLog:
    """Tells that Redis is unavailable once, again every REMIND_S while it stays so, and once that it answers again.

    For loops that retry every tick (the scheduler's, 5 a second): a line per try filled the log for as long as an
    outage lasted, and one that nobody fixes (a password changed under a running farm) lasts until someone looks.
    """

    REMIND_S = 60.0

    def __init__(self, logger: logging.Logger, who: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._who = who
        self._clock = clock
        self._since: float | None = None  # when the outage under way began
        self._told_at = 0.0

    def lost(self, exc: BaseException, hint: str = "") -> None:
        """A try failed for want of Redis (``exc``; ``hint``: what may fix it, connection_hint)."""
        now = self._clock()
        if self._since is None:
            self._since = self._told_at = now
            self._logger.warning("%s: Redis unavailable (%s%s); retrying", self._who, exc, hint)
        elif now - self._told_at >= self.REMIND_S:
            self._told_at = now
            self._logger.warning(
                "%s: Redis still unavailable after %.0fs (%s%s); retrying", self._who, now - self._since, exc, hint
            )

    def answered(self) -> None:
        """A try went through: the outage, if one was on, is over."""
        if self._since is not None:
            self._logger.warning("%s: Redis answers again after %.1fs", self._who, self._clock() - self._since)
            self._since = None


def url_option_problem(url: str) -> str | None:
    """What is wrong with the options in a Redis URL's query (a misspelt name, a value of the wrong kind, a TLS
    option on a plain redis:// URL), said without its password; None when redis-py takes them all. redis-py itself
    says so only when a first command connects, in a TypeError's traceback."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()  # (REDIS:// is taken as redis://)
    try:
        options: dict[str, Any] = parse_url(f"{scheme}://{rest}")  # type: ignore[no-untyped-call]
    except ValueError as exc:  # ("Invalid value for 'socket_timeout' in connection URL.": no part of the password)
        return f"its query: {exc}"
    kind = UnixDomainSocketConnection if scheme == "unix" else SSLConnection if scheme == "rediss" else SyncConnection
    # (connection_class: parse_url's own, for the scheme; the pool's options, max_connections and the like, are
    # taken by the pool from_url makes)
    unknown = sorted(set(options) - _taken_by(kind) - _taken_by(BlockingConnectionPool) - {"connection_class"})
    if unknown:
        if scheme == "redis" and not set(unknown) - _taken_by(SSLConnection):
            return f"its query names {', '.join(unknown)}, which only a rediss:// (TLS) URL takes"
        return f"its query names {', '.join(unknown)}, which redis-py does not take"
    return _query_value_problem(rest.partition("?")[2], kind, _taken_by(kind), options)


# The yes-or-no query values taken: redis-py's spellings of no (redis.connection.to_bool, which compares them in upper
# case) and their counterparts; to_bool reads any other value, a misspelt "flase" say, as yes.
_YES_OR_NO = frozenset(FALSE_STRINGS) | {"1", "T", "TRUE", "Y", "YES"}


def _query_value_problem(
    query: str, kind: Callable[..., object], taken_names: frozenset[str], options: dict[str, Any]
) -> str | None:
    """What is wrong with the values of a URL's query whose names redis-py all takes: a name given twice (redis-py
    took the first), a yes-or-no that is neither, a value the connection refuses (``ssl_cert_reqs=bogus``, which
    redis-py refused only as a first command connected, in a traceback)."""
    given = urllib.parse.parse_qs(query, keep_blank_values=True)
    twice = sorted(name for name, values in given.items() if len(values) > 1)
    if twice:
        return f"its query names {', '.join(twice)} more than once"
    for name, values in given.items():
        if URL_QUERY_ARGUMENT_PARSERS.get(name) is to_bool and values[0] and values[0].upper() not in _YES_OR_NO:
            return f"its query: {name}={values[0]!r} is neither yes nor no (true/false, 1/0, yes/no)"
    taken = {name: value for name, value in options.items() if name in taken_names}
    try:
        kind(**taken)
    except (RedisError, ValueError, TypeError) as exc:
        return f"its query: {exc}"
    return None


@functools.cache
def _taken_by(kind: type[Any]) -> frozenset[str]:
    """The keyword arguments a redis-py connection class takes (its own and its bases')."""
    taken: set[str] = set()
    for cls in kind.__mro__:
        if "__init__" in cls.__dict__:
            parameters = inspect.signature(cls.__dict__["__init__"]).parameters.values()
            taken |= {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(taken)


_TLS_FILE_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


def connection_hint(url: str, exc: BaseException) -> str:
    """What to add to ``exc``, a failure to connect to ``url``, when the URL itself is the likely cause: a TLS file
    it names that is not there (redis-py says only "No such file or directory"), or a plain redis:// URL whose
    server reset the connection (what a TLS port does to a client that does not speak TLS)."""
    if isinstance(exc, InvalidResponse) and 'got "H"' in str(exc):  # "HTTP/1.1 400 ...": the reply of an HTTP server
        return (
            " (an HTTP server answered there, a gateway's port perhaps: the farm's Redis has a port of its own, on"
            " the `redis` line `streamserve up` prints)"
        )
    if not isinstance(exc, RETRYABLE_ERRORS):
        return ""
    parsed = urllib.parse.urlsplit(url)
    missing = _missing_tls_files(url)
    if missing:
        return f" (no such file: {', '.join(missing)})"
    if "authentication required" in str(exc).lower() and not parsed.password:
        return (
            " (give the password in the URL or STREAMSERVE_REDIS_PASSWORD; if this is the Redis `streamserve up` "
            "embeds, its password is in the data directory's redis_password: run the command beside the farm, or "
            "with --data-dir)"
        )
    if parsed.scheme.lower() == "redis" and "reset by peer" in str(exc).lower():
        return " (if that port speaks TLS, the URL starts with rediss://)"
    # (A rediss:// URL at a plain Redis's port is PlainRedisAtTLSPort, which says so itself; a TLS handshake that
    # timed out where no plain Redis answers either says nothing about the scheme.)
    return ""


def _missing_tls_files(url: str) -> list[str]:
    """The TLS files ``url`` names that are not there, each as "PARAM PATH"."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return [f"{name} {path}" for name in _TLS_FILE_PARAMS for path in query.get(name, []) if not os.path.exists(path)]


def retry_cannot_mend(url: str, exc: BaseException) -> bool:
    """Whether ``exc``, a failure to connect to ``url``, is the set-up's, not a Redis on its way up: what no retry
    mends (UNMENDABLE_ERRORS: a refused password, a rediss:// URL at a plain Redis's port), a server certificate
    that does not verify, a TLS file the URL names that is not there. A process that waits for Redis to come up (the
    scheduler) stops on these at once, as the others do."""
    if _unmendable(exc):
        return True
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        cause = cause.__cause__ or cause.__context__
    return isinstance(exc, RETRYABLE_ERRORS) and bool(_missing_tls_files(url))


# What Redis answers the SELECT of a database it does not have (the URL's /N).
NO_SUCH_DATABASE = "DB index is out of range"


class RedisRefusals:
    """``with`` block: what Redis failures mean to a caller, as StreamServeErrors naming the (redacted) URL.

    A lost connection, or a server that does not speak Redis's protocol (an HTTP port, say), becomes
    RedisUnavailableError; a write refused for memory becomes OverloadedError (503: try again later). A class, not
    a generator-based context manager: one instance is reused on the hot path (every enqueue), where a generator
    frame per call would show.
    """

    def __init__(self, url: str, unreachable_hint: str = "") -> None:
        """``unreachable_hint``: what to add when Redis cannot be reached and the URL itself says nothing (a
        client's that fell back to the default Redis)."""
        self._given = url
        self._url = redacted(url)
        self._unreachable_hint = unreachable_hint

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and (error := self.meaning(exc)) is not None:
            raise error from exc

    def meaning(self, exc: BaseException) -> StreamServeError | None:
        """What ``exc`` means to a caller, or None when it is not one of the failures above."""
        if isinstance(exc, RETRYABLE_ERRORS):
            hint = connection_hint(self._given, exc) or self._unreachable_hint
            return RedisUnavailableError(f"cannot reach Redis at {self._url}: {exc}{hint}")
        if isinstance(exc, InvalidResponse):
            return RedisUnavailableError(
                f"the server at {self._url} does not answer as Redis: {exc}{connection_hint(self._given, exc)}"
            )
        if isinstance(exc, ResponseError) and str(exc).startswith(NO_SUCH_DATABASE):
            return ConfigError(
                f"the Redis at {self._url} has no database of the number its URL names ({exc}): that number (/N, or"
                " ?db=N) must be below the server's `databases` setting (16 by default)"
            )
        if refuses_writes(exc):
            return OverloadedError(
                f"Redis at {self._url} refuses writes, {why_writes_refused(exc)}: nothing was written"
            )
        if isinstance(exc, NoPermissionError):
            return StreamServeError(
                f"Redis at {self._url} refused a command: its user lacks a permission streamserve needs ({exc});"
                " docs/operations.md (Security) gives the ACL rules a farm's user needs"
            )
        return None
