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
POOL_MAX_CONNECTIONS = 100
"""Connections one asyncio process opens to Redis at most."""
POOL_TIMEOUT_S = 10.0
"""How long a command waits for a free connection before it fails as RedisUnavailableError."""


def async_redis(url: str, *, max_connections: int | None = None) -> aioredis.Redis:
    """An asyncio client (bytes replies) with the shared retry policy.

    Its pool blocks when all its connections are busy instead of failing: a
    gateway with more requests in flight than connections makes them wait
    their turn for a round trip, not answer 503 (redis-py's default pool
    raises "Too many connections" past 100).
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections or POOL_MAX_CONNECTIONS,
        timeout=POOL_TIMEOUT_S,
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
