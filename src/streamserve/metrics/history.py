"""Samples of each deployment's metrics every few seconds, in a capped stream: the dashboard draws the last
minutes at once, whichever gateway serves it and whenever it is opened. The leading scheduler takes them."""

from __future__ import annotations

import orjson
import redis.asyncio as aioredis

from streamserve.metrics.series import sample
from streamserve.wire.keys import Keys
from streamserve.wire.messages import text

SAMPLE_EVERY_MS = 5000
# Samples kept per deployment: 15 minutes.
SAMPLES_KEPT = 180


class MetricsHistory:
    """Call ``maybe_sample`` on every tick; it samples once SAMPLE_EVERY_MS has passed."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._last_ms = 0

    async def maybe_sample(self, names: list[str], now_ms: int) -> bool:
        """Sample the deployments' metrics if one is due (whether one was written)."""
        if now_ms - self._last_ms < SAMPLE_EVERY_MS or not names:
            return False
        self._last_ms = now_ms
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(self._keys.metrics(name))
            hashes = await pipe.execute()
        async with self._redis.pipeline(transaction=False) as pipe:
            for name, raw in zip(names, hashes, strict=True):
                totals = {text(k): text(v) for k, v in raw.items()}
                fields = {"s": orjson.dumps(sample(totals, now_ms))}
                pipe.xadd(self._keys.metrics_history(name), fields, maxlen=SAMPLES_KEPT, approximate=True)  # type: ignore[arg-type]
            await pipe.execute()
        return True
