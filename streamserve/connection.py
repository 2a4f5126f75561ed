"""Redis connections built one way, with one retry policy shared by every process."""

from __future__ import annotations

import inspect
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from streamserve.errors import OverloadedError, RedisUnavailableError, StreamServeError

# Errors worth retrying: the connection, not the command, failed.
RETRYABLE_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ConnectionResetError)

RETRY_ATTEMPTS = 5
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0


# Connections one asyncio client opens at most; more concurrent commands wait for a free one.
def _quiet_handshake() -> dict[str, Any]:
    """Connection options that keep redis-py from sending optional CLIENT commands on every connect.

    CLIENT SETINFO is Redis 7.2+ (older servers count a failed call each time) and redis-py 8's
    CLIENT MAINT_NOTIFICATIONS is for Redis Enterprise; an ACL user confined to the farm's commands
    (README "Security") cannot be granted either on Redis 7.0. The option names depend on the
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
# How long a command waits for a free connection before it counts as Redis being unavailable.
POOL_WAIT_S = 20.0


def _options(retry: Retry | AsyncRetry) -> dict[str, Any]:
    """What every connection of every process shares: bytes replies, the retry policy, a quiet handshake."""
    return {
        "decode_responses": False,
        "retry": retry,
        "retry_on_error": list(RETRYABLE_ERRORS),
        "health_check_interval": 30,
        **QUIET_HANDSHAKE,
    }


def async_redis(url: str, *, max_connections: int = POOL_SIZE) -> aioredis.Redis:
    """An asyncio client (bytes replies) with the shared retry policy.

    The pool blocks when all its connections are busy: redis-py's default
    pool raises instead, which would fail a caller that merely has many
    requests in flight.
    """
    backoff = ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=POOL_WAIT_S, **_options(AsyncRetry(backoff, RETRY_ATTEMPTS))
    )
    return aioredis.Redis.from_pool(pool)


def sync_redis(url: str, *, max_connections: int | None = None) -> redis.Redis:
    """A blocking client (bytes replies) with the shared retry policy, for the CLI, RQ and job calls.

    With ``max_connections``, a thread that finds them all busy waits for one (up to POOL_WAIT_S).
    """
    options = _options(Retry(ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S), RETRY_ATTEMPTS))
    if max_connections is None:
        return redis.Redis.from_url(url, **options)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=POOL_WAIT_S, **options)
    return redis.Redis.from_pool(pool)


def redacted(url: str) -> str:
    """The URL with any user and password replaced by ``***``, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether Redis refused a write for lack of memory (maxmemory reached with the noeviction policy)."""
    # redis-py raises OutOfMemoryError for a plain command or a transaction; inside a Lua script the refusal
    # arrives as "Error running script ... -OOM command not allowed ...".
    return isinstance(exc, OutOfMemoryError) or (
        isinstance(exc, ResponseError) and "OOM command not allowed" in str(exc)
    )


class RedisRefusals:
    """``with`` block: what Redis failures mean to a caller, as StreamServeErrors naming the (redacted) URL.

    A lost connection becomes RedisUnavailableError; a write refused for memory becomes OverloadedError
    (503: try again later). A class, not a generator-based context manager: one instance is reused on the
    hot path (every enqueue), where a generator frame per call would show.
    """

    def __init__(self, url: str) -> None:
        self._url = redacted(url)

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
            return RedisUnavailableError(f"cannot reach Redis at {self._url}: {exc}")
        if is_out_of_memory(exc):
            return OverloadedError(f"Redis at {self._url} is out of memory (maxmemory): nothing was written")
        return None
