"""Redis connections built one way, with one retry policy shared by every process."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

RETRYABLE_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ConnectionResetError)
"""Errors worth retrying: the connection, not the command, failed."""

RETRY_ATTEMPTS = 5
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0


POOL_SIZE = 64
"""Connections one asyncio client opens at most; more concurrent commands wait for a free one."""
POOL_WAIT_S = 20.0
"""How long a command waits for a free connection before it counts as Redis being unavailable."""


def async_redis(url: str, *, max_connections: int = POOL_SIZE) -> aioredis.Redis:
    """An asyncio client (bytes replies) with the shared retry policy.

    The pool blocks when all its connections are busy: redis-py's default
    pool raises instead, which would fail a caller that merely has many
    requests in flight.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        decode_responses=False,
        retry=AsyncRetry(ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S), RETRY_ATTEMPTS),
        retry_on_error=list(RETRYABLE_ERRORS),
        health_check_interval=30,
    )
    return aioredis.Redis.from_pool(pool)


def sync_redis(url: str) -> redis.Redis:
    """A blocking client (bytes replies) with the shared retry policy, for the CLI."""
    return redis.Redis.from_url(
        url,
        decode_responses=False,
        retry=Retry(ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S), RETRY_ATTEMPTS),
        retry_on_error=list(RETRYABLE_ERRORS),
        health_check_interval=30,
    )
