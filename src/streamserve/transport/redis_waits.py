"""How long a read waits for a Redis that does not answer: one that hangs (a slow command, a stall) refuses nothing,
and nothing else would end the wait."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from streamserve.transport.connections import redacted
from streamserve.wire.errors import RedisUnavailableError

# How long the gateway's probes wait for a Redis that does not answer before a 503: less than a load balancer's
# timeout.
PROBE_REDIS_WAIT_S = 2.0
# How long a read of the farm's figures (the gateway's status, metrics and dashboard data; `streamserve health`, an
# exec probe that waited as long as the hang, 35 s and more) waits for Redis.
READ_REDIS_WAIT_S = 5.0


@contextlib.asynccontextmanager
async def redis_answers_within(seconds: float, url: str) -> AsyncIterator[None]:
    """RedisUnavailableError (503) when what the block awaits of the Redis at ``url`` takes more than ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise RedisUnavailableError(f"Redis at {redacted(url)} did not answer within {seconds:g}s") from None
