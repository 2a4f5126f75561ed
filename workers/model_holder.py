"""What a replica of a multiplexing deployment does with the models its caches load (streamserve.multiplexing).

A model loaded makes the replica one of the model's holders (in Redis, renewed every heartbeat interval) and adds the
model's stream to what it reads, so requests for the model come to it (wire/models.py); a model unloaded, or the
replica leaving, undoes both, and the model's queued requests go back to the deployment's stream when no other
replica holds it. Loads and hits are counted. The caches tell it from whatever thread they run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from streamserve.metrics.definitions import MODEL_HIT, MODEL_LOAD, MODEL_LOAD_DURATION, MODEL_LOADS, MODEL_REQUESTS
from streamserve.metrics.figures import Figures
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RETRYABLE_ERRORS
from streamserve.transport.model_streams import ModelStreams

logger = logging.getLogger(__name__)


def holder_ttl_ms(settings: Settings) -> int:
    """How long a holder counts without renewal: a beat less than the heartbeat timeout (at least two beats), so that
    a dead holder's model stream is given back within the time its replica is written off in."""
    interval, timeout = settings.heartbeat_interval_s, settings.heartbeat_timeout_s
    return int(1000 * max(timeout - interval, 2 * interval))


class ModelHolder:
    """The models one replica holds; streamserve.multiplexing's ModelEvents."""

    def __init__(
        self,
        settings: Settings,
        streams: ModelStreams,
        deployment: str,
        replica_id: str,
        figures: Figures | None,
        on_change: Callable[[list[str]], None],
    ) -> None:
        """``on_change``: called (on the loop) with the models held whenever they change, to read their streams."""
        self._settings = settings
        self._streams = streams
        self._deployment = deployment
        self._replica_id = replica_id
        self._figures = figures
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._held: dict[str, None] = {}  # in the order loaded
        self.ever: set[str] = set()  # every model it held: streams it is a consumer of
        self._ttl_ms = holder_ttl_ms(settings)
        self._writes = asyncio.Lock()  # holds and let-gos reach Redis in the order they happened
        self._tasks: set[asyncio.Task[None]] = set()
        self._leaving = False

    @property
    def models(self) -> list[str]:
        """The models held now (the heartbeat says them, for status)."""
        return list(self._held)

    # -- ModelEvents (any thread) ----------------------------------------------------

    def loaded(self, model_id: str, seconds: float) -> None:
        self._on_loop(self._loaded, model_id, seconds)

    def unloaded(self, model_id: str) -> None:
        self._on_loop(self._unloaded, model_id)

    def used(self, model_id: str, hit: bool) -> None:
        if self._figures is not None:
            self._on_loop(self._figures.count, self._deployment, MODEL_REQUESTS, MODEL_HIT if hit else MODEL_LOAD)

    def _on_loop(self, fn: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the replica is gone
                self._loop.call_soon_threadsafe(fn, *args)

    # -- on the loop -----------------------------------------------------------------

    def _loaded(self, model_id: str, seconds: float) -> None:
        if self._figures is not None:
            self._figures.count(self._deployment, MODEL_LOADS, "")
            self._figures.observe(self._deployment, MODEL_LOAD_DURATION, seconds)
        logger.info("replica %s: loaded model %s in %.3fs", self._replica_id, model_id, seconds)
        self._held[model_id] = None
        self.ever.add(model_id)
        if not self._leaving:
            self._write(self._hold(model_id))

    def _unloaded(self, model_id: str) -> None:
        logger.info("replica %s: unloaded model %s", self._replica_id, model_id)
        if self._held.pop(model_id, 0) is None:
            self._on_change(self.models)
            self._write(self._let_go([model_id]))

    async def _hold(self, model_id: str) -> None:
        await self._streams.hold(self._deployment, self._replica_id, [model_id], self._ttl_ms)
        if model_id in self._held and not self._leaving:
            self._on_change(self.models)  # its stream exists now, with this replica among its holders

    async def _let_go(self, model_ids: list[str]) -> None:
        await self._streams.let_go(self._deployment, self._replica_id, model_ids)

    def _write(self, step: object) -> None:
        async def write() -> None:
            async with self._writes:
                try:
                    await step  # type: ignore[misc]
                except RETRYABLE_ERRORS as exc:  # the next renewal holds it again; a let-go is the sweep's then
                    logger.warning("replica %s: model streams: %s", self._replica_id, exc)

        task = asyncio.create_task(write())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def renew(self) -> None:
        """Renew this replica's holds (and make again a model stream disbanded meanwhile); every heartbeat."""
        if self._held and not self._leaving:
            async with self._writes:
                await self._streams.hold(self._deployment, self._replica_id, self.models, self._ttl_ms)

    async def run(self) -> None:
        """Renew every heartbeat interval until cancelled."""
        while True:
            await asyncio.sleep(self._settings.heartbeat_interval_s)
            try:
                await self.renew()
            except RETRYABLE_ERRORS as exc:
                logger.warning("replica %s: renewing its models failed: %s", self._replica_id, exc)

    async def leave(self) -> None:
        """The replica reads no more: it holds no model from now on (their queues go to other replicas)."""
        self._leaving = True
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        if self._held:
            async with self._writes:
                await self._let_go(self.models)
