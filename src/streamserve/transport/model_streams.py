"""The model streams of a multiplexing deployment (wire/models.py), as replicas, the scheduler and status use them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from streamserve.wire import scripts
from streamserve.wire.keys import CONSUMER_GROUP, Keys

# Keys.model_backlog holds at most this many placeholders: KEDA's count of model streams' entries tops out there.
BACKLOG_CAP = 10_000


@dataclass(frozen=True)
class ModelBacklog:
    """A deployment's model streams together: entries in them (queued and running), running, and given back to the
    deployment's stream by this look."""

    length: int = 0
    pending: int = 0
    given_back: int = 0

    @property
    def queued(self) -> int:
        return max(0, self.length - self.pending)


class ModelStreams:
    """scripts.HOLD_MODEL and scripts.MODEL_STREAMS, with their keys."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._hold = redis.register_script(scripts.HOLD_MODEL)
        self._streams = redis.register_script(scripts.MODEL_STREAMS)

    async def hold(self, deployment: str, replica_id: str, model_ids: Sequence[str], ttl_ms: int) -> None:
        """Count ``replica_id`` among the holders of ``model_ids`` for ``ttl_ms`` more (making their streams)."""
        k = self._keys
        for model_id in model_ids:  # a replica holds a few (max_models_per_replica)
            keys = [k.model_requests(deployment, model_id), k.model_holders(deployment, model_id), k.models(deployment)]
            await self._hold(keys=keys, args=[CONSUMER_GROUP, replica_id, ttl_ms, model_id])

    async def let_go(self, deployment: str, replica_id: str, model_ids: Sequence[str]) -> ModelBacklog:
        """``replica_id`` holds ``model_ids`` no more: those no live replica holds give their queues back."""
        return await self._run(deployment, sweep=True, leaving=replica_id, model_ids=model_ids)

    async def sweep(self, deployment: str) -> ModelBacklog:
        """Disband every model stream no live replica holds; the figures, kept for KEDA too (Keys.model_backlog)."""
        return await self._run(deployment, sweep=True, backlog=True)

    async def figures(self, deployment: str) -> ModelBacklog:
        """The figures alone (status)."""
        return await self._run(deployment)

    async def _run(
        self,
        deployment: str,
        *,
        sweep: bool = False,
        leaving: str = "",
        model_ids: Sequence[str] = (),
        backlog: bool = False,
    ) -> ModelBacklog:
        k = self._keys
        keys = [k.models(deployment), k.requests(deployment)]
        if backlog:
            keys.append(k.model_backlog(deployment))
        args: list[str | int] = [
            CONSUMER_GROUP,
            k.model_requests(deployment, ""),
            k.model_holders(deployment, ""),
            int(sweep),
            leaving,
            BACKLOG_CAP,
            *model_ids,
        ]
        length, pending, given_back = await self._streams(keys=keys, args=args)
        return ModelBacklog(int(length), int(pending), int(given_back))
