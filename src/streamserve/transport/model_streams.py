"""The routed streams of a multiplexing deployment (wire/models.py), as replicas, the scheduler and status use them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from streamserve.wire import scripts
from streamserve.wire.ids import NO_STREAM_ID, StreamId, stream_id
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import text

# Keys.model_backlog holds at most this many placeholders: KEDA's count of routed entries tops out there.
BACKLOG_CAP = 10_000


@dataclass(frozen=True)
class RoutedBacklog:
    """A deployment's routed streams together: entries in them (queued and running), running, and given back to the
    deployment's stream by this look; for the scheduler's sweep, the id of the last entry a replica read from them."""

    length: int = 0
    pending: int = 0
    given_back: int = 0
    last_read: StreamId = NO_STREAM_ID

    @property
    def queued(self) -> int:
        return max(0, self.length - self.pending)


class ModelStreams:
    """scripts.HOLD_MODEL and scripts.ROUTED_STREAMS, with their keys."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._hold = redis.register_script(scripts.HOLD_MODEL)
        self._routed = redis.register_script(scripts.ROUTED_STREAMS)

    async def hold(
        self, deployment: str, replica_id: str, model_ids: Sequence[str], ttl_ms: int, max_models: int
    ) -> set[str]:
        """``replica_id`` is live, with a routed stream and room for ``max_models``, and holds ``model_ids``, for
        ``ttl_ms`` more; those of them another live replica holds too."""
        k = self._keys
        keys = [
            k.routed_requests(deployment, replica_id),
            k.routed_replicas(deployment),
            k.models_of(deployment, replica_id),
            k.model_room(deployment),
            *(k.model_holders(deployment, model_id) for model_id in model_ids),
        ]
        shared = await self._hold(keys=keys, args=[CONSUMER_GROUP, replica_id, ttl_ms, max_models, *model_ids])
        return {text(model_id) for model_id in shared}

    async def unhold(self, deployment: str, replica_id: str, model_id: str) -> None:
        """``replica_id`` holds ``model_id`` no more (requests already routed to it stay: it loads the model again)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self._keys.model_holders(deployment, model_id), replica_id)
            pipe.zrem(self._keys.models_of(deployment, replica_id), model_id)
            await pipe.execute()

    async def leave(self, deployment: str, replica_id: str, model_ids: Sequence[str]) -> RoutedBacklog:
        """``replica_id`` reads no more: it holds none of ``model_ids`` from now on, and its queued requests go back to
        the deployment's stream."""
        holders = [self._keys.model_holders(deployment, model_id) for model_id in model_ids]
        return await self._run(deployment, give_back=True, leaving=replica_id, holders=holders)

    async def sweep(self, deployment: str) -> RoutedBacklog:
        """Give back the queues of replicas gone; the figures, kept for KEDA too (Keys.model_backlog)."""
        return await self._run(deployment, give_back=True, backlog_cap=BACKLOG_CAP, last_read=True)

    async def figures(self, deployment: str) -> RoutedBacklog:
        """The figures alone (status)."""
        return await self._run(deployment)

    async def _run(
        self,
        deployment: str,
        *,
        give_back: bool = False,
        leaving: str = "",
        holders: Sequence[str] = (),
        backlog_cap: int = 0,
        last_read: bool = False,
    ) -> RoutedBacklog:
        k = self._keys
        keys = [k.routed_replicas(deployment), k.requests(deployment), k.model_backlog(deployment)]
        keys += [k.model_room(deployment), *holders]
        args: list[str | int] = [
            CONSUMER_GROUP,
            k.models_prefix(deployment),
            int(give_back),
            leaving,
            backlog_cap,
            int(last_read),
        ]
        length, pending, given_back, last = await self._routed(keys=keys, args=args)
        return RoutedBacklog(int(length), int(pending), int(given_back), stream_id(last))
