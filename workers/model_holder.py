"""What a replica of a multiplexing deployment does with the models its caches load (streamserve.multiplexing).

The replica has a routed stream of its own (wire/models.py), made as it starts and read besides its deployment's.
A model loaded makes it one of the model's holders (in Redis, renewed every heartbeat interval with the replica's
own time), so requests for the model are routed to it; a model unloaded undoes that; the replica leaving gives its
queued routed requests back to the deployment's stream. Loads and hits are counted. The caches tell it from whatever
thread they run on, and ask it which of its models another replica holds too (as of its last renewal): they unload
those first, so that a model loaded twice (a request that was not routed by its model, a hold that lapsed) does not
leave another held by nobody for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable

from redis.exceptions import ResponseError

from streamserve.metrics.definitions import MODEL_HIT, MODEL_LOAD, MODEL_LOAD_DURATION, MODEL_LOADS, MODEL_REQUESTS
from streamserve.metrics.figures import Figures
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RETRYABLE_ERRORS, refuses_writes
from streamserve.transport.model_streams import ModelStreams
from streamserve.wire.models import hold_ms

logger = logging.getLogger(__name__)


class ModelHolder:
    """The models one replica holds; streamserve.multiplexing's ModelEvents."""

    def __init__(
        self,
        settings: Settings,
        streams: ModelStreams,
        deployment: str,
        replica_id: str,
        figures: Figures | None,
        max_models: int,
    ) -> None:
        """``max_models``: how many models its caches keep together (what the routing gives it at most)."""
        self._settings = settings
        self._max_models = max_models
        self._streams = streams
        self._deployment = deployment
        self._replica_id = replica_id
        self._figures = figures
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._held: dict[str, None] = {}  # in the order loaded
        self._shared: frozenset[str] = frozenset()  # held models another replica holds too (replaced, never changed)
        self._ttl_ms = hold_ms(settings.heartbeat_interval_s, settings.heartbeat_timeout_s)
        self._writes = asyncio.Lock()  # holds and unholds reach Redis in the order they happened
        self._tasks: set[asyncio.Task[None]] = set()
        self._leaving = False

    @property
    def models(self) -> list[str]:
        """The models held now (the heartbeat says them, for status)."""
        return list(self._held)

    async def start(self) -> None:
        """Make the replica's routed stream (before it reads it), and count it live."""
        await self.renew()

    # -- ModelEvents (any thread) ----------------------------------------------------

    def loaded(self, model_id: str, seconds: float) -> None:
        self._on_loop(self._loaded, model_id, seconds)

    def unloaded(self, model_id: str) -> None:
        self._on_loop(self._unloaded, model_id)

    def failed(self, model_id: str) -> None:
        self._on_loop(self._let_go, model_id)

    def used(self, model_id: str, hit: bool) -> None:
        self._on_loop(self._used, model_id, hit)

    def shared(self) -> frozenset[str]:
        return self._shared

    def _on_loop(self, fn: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the replica is gone
                self._loop.call_soon_threadsafe(fn, *args)

    # -- on the loop -----------------------------------------------------------------

    def _used(self, model_id: str, hit: bool) -> None:
        if self._figures is not None:
            self._figures.count(self._deployment, MODEL_REQUESTS, MODEL_HIT if hit else MODEL_LOAD)
        if not hit and model_id not in self._held:  # it loads it: its next requests come here, and it has less room
            self._hold(model_id)

    def _hold(self, model_id: str) -> None:
        self._held[model_id] = None
        if not self._leaving:
            self._write(lambda: self._hold_in_redis([model_id]))

    async def _hold_in_redis(self, model_ids: list[str]) -> None:
        shared = await self._streams.hold(self._deployment, self._replica_id, model_ids, *self._terms)
        self._shared = self._shared.difference(model_ids).union(shared)  # (a renewal names all it holds)

    @property
    def _terms(self) -> tuple[int, int]:
        return self._ttl_ms, self._max_models

    def _loaded(self, model_id: str, seconds: float) -> None:
        if self._figures is not None:
            self._figures.count(self._deployment, MODEL_LOADS, "")
            self._figures.observe(self._deployment, MODEL_LOAD_DURATION, seconds)
        logger.info("replica %s: loaded model %s in %.3fs", self._replica_id, model_id, seconds)
        if model_id not in self._held:
            self._hold(model_id)

    def _unloaded(self, model_id: str) -> None:
        logger.info("replica %s: unloaded model %s", self._replica_id, model_id)
        self._let_go(model_id)

    def _let_go(self, model_id: str) -> None:
        self._shared = self._shared.difference((model_id,))
        if self._held.pop(model_id, 0) is None and not self._leaving:
            self._write(lambda: self._streams.unhold(self._deployment, self._replica_id, model_id))

    def _write(self, step: Callable[[], Awaitable[object]]) -> None:
        async def write() -> None:
            async with self._writes:
                if self._leaving:
                    return
                try:
                    await step()
                except RETRYABLE_ERRORS as exc:  # the next renewal holds what it holds then
                    logger.warning("replica %s: holding its models: %s", self._replica_id, exc)

        task = asyncio.create_task(write())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def renew(self) -> None:
        """Renew this replica's holds and its routed stream (making it again if it was given back meanwhile)."""
        async with self._writes:
            if not self._leaving:
                await self._hold_in_redis(self.models)

    async def run(self) -> None:
        """Renew every heartbeat interval until cancelled."""
        while True:
            await asyncio.sleep(self._settings.heartbeat_interval_s)
            try:
                await self.renew()
            except RETRYABLE_ERRORS as exc:
                logger.warning("replica %s: renewing its models failed: %s", self._replica_id, exc)
            except ResponseError as exc:  # Redis refusing writes (out of memory, a full disk): the next renewal
                if not refuses_writes(exc):
                    raise
                logger.warning("replica %s: renewing its models failed: %s", self._replica_id, exc)

    async def leave(self) -> None:
        """The replica reads no more: it holds no model from now on, and its queued routed requests go to the other
        replicas."""
        async with self._writes:
            self._leaving = True
            await self._streams.leave(self._deployment, self._replica_id, self.models)
