"""Adds a process's figures to the farm's totals in Redis, once a second (HINCRBY on the metrics hashes).

Every gateway and replica adds into the same per-deployment hashes, so any
gateway's ``/metrics`` shows the whole farm, on one host or many, and the
totals outlive the processes that counted them. A flush that fails (Redis
away, or out of memory) keeps its deltas for the next one; a process killed
with -9 loses at most the last second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import redis.asyncio as aioredis

from streamserve.metrics.definitions import TENANT_REQUESTS
from streamserve.metrics.figures import Figures
from streamserve.transport.connections import RETRYABLE_ERRORS, WriteRefusals
from streamserve.wire import scripts
from streamserve.wire.keys import Keys
from streamserve.wire.messages import text
from streamserve.wire.tenants import OTHER_TENANTS, TENANT_LABEL_CAP

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0


class MetricsFlusher:
    """Runs in the background of a process that counts (``start``/``aclose``)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        figures: Figures,
        interval_s: float = FLUSH_INTERVAL_S,
        exists: Callable[[str], bool] | None = None,
    ):
        """``exists``: whether a deployment (or endpoint) the figures name still exists; those of one deleted are
        dropped, not written (a flush after the delete made its hash again, for good, and a new deployment of the
        name started from its old totals)."""
        self._redis = redis
        self._exists = exists
        self._keys = keys
        self.figures = figures
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # the loop ends on it too: redis-py can swallow a cancellation that lands in a write
        self._refusals = WriteRefusals(logger, "metrics")
        self._label = redis.register_script(scripts.TENANT_LABELS)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="metrics-flusher")

    async def aclose(self) -> None:
        """Stop, after one last flush."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.flush()
        except RETRYABLE_ERRORS:
            pass
        except Exception as exc:
            if not self._refusals.refused(exc):
                raise

    async def _loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._interval_s)
            try:
                wrote = await self.flush()
            except RETRYABLE_ERRORS as exc:
                logger.debug("metrics: flush failed, kept for the next one: %s", exc)
            except Exception as exc:
                if not self._refusals.refused(exc):  # kept for the next one as well
                    raise
            else:
                if wrote:
                    self._refusals.accepted()

    async def flush(self) -> bool:
        """Add what was counted since the last flush (whether there was some); on a Redis error, keep what is not
        written yet."""
        deltas = self.figures.take()
        if self._exists is not None:
            deltas = {deployment: fields for deployment, fields in deltas.items() if self._exists(deployment)}
        for index, (deployment, fields) in enumerate(deltas.items()):
            try:
                if any(name.startswith(TENANT_REQUESTS.prefix) for name in fields):
                    fields = deltas[deployment] = await self._cap_tenants(deployment, fields)
                # One transaction per deployment: its fields are added all together or not at all.
                async with self._redis.pipeline(transaction=True) as pipe:
                    key = self._keys.metrics(deployment)
                    for name, amount in fields.items():
                        if isinstance(amount, int):
                            pipe.hincrby(key, name, amount)
                        else:
                            pipe.hincrbyfloat(key, name, amount)
                    await pipe.execute()
            except BaseException:
                self.figures.put_back(dict(list(deltas.items())[index:]))
                raise
        return bool(deltas)

    async def _cap_tenants(self, deployment: str, fields: dict[str, int | float]) -> dict[str, int | float]:
        """``fields`` with the tenants past the deployment's TENANT_LABEL_CAP counted as OTHER_TENANTS (which
        tenants have a label is kept in Redis, so every gateway labels alike)."""
        # In the order they were first counted (a flush holds many): the first tenants seen keep their labels.
        tenants = list(dict.fromkeys(labels[0] for name in fields if (labels := TENANT_REQUESTS.labels_of(name))))
        kept = {
            text(t)
            for t in await self._label(keys=[self._keys.tenant_labels(deployment)], args=[TENANT_LABEL_CAP, *tenants])
        }
        capped: dict[str, int | float] = {}
        for name, amount in fields.items():
            labels = TENANT_REQUESTS.labels_of(name)
            if labels is not None and labels[0] not in kept:
                name = TENANT_REQUESTS.field(OTHER_TENANTS, int(labels[1]))
            capped[name] = capped.get(name, 0) + amount
        return capped
