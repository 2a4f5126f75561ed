"""Dynamic batching in the replica: the requests of a ``@batch`` handler are collected and run as one call.

Each request keeps its own slot of ``max_ongoing_requests`` while it waits
for its batch and while the batch runs: a batch of N holds N slots, so a
replica never holds more requests than the limit, whatever the batch size,
and the largest batch is the smaller of ``max_batch_size`` and
``max_ongoing_requests`` (a batch that size runs at once: no more can come).

A batch holds requests for one model only (wire/models.py: ``streamserve.model_id()``
inside the call is theirs): each model a handler is asked for has batches of its
own. The batches of one handler and model run one at a time. A batch runs as
soon as it is full, or ``batch_wait_timeout_s`` after its first request arrived;
while one runs, the replica keeps reading up to its free slots and those
requests form the next batch. A request whose deadline passed while it waited
is answered without joining the batch. On drain, what is waiting runs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from streamserve.batching import BatchConfig, check_outputs
from streamserve.wire.messages import now_ms
from streamserve.workers.loader import Handler

logger = logging.getLogger(__name__)

# A replica keeps a batcher per batched handler and model; past this many, the idle ones are dropped as a new one is
# made (a deployment with thousands of models would otherwise keep one for each model it was ever asked for).
IDLE_BATCHERS_KEPT = 64

# Runs the handler on a list of bodies (the replica's executor or loop decides how).
RunBatch = Callable[[list[Any]], Awaitable[Any]]
# Runs a handler on a batch's bodies, for the batch's model ("" for none).
RunHandler = Callable[[Handler, Any, str], Awaitable[Any]]


class DeadlinePassed(Exception):
    """The request's deadline passed while it waited for its batch; the handler never saw it."""


@dataclass(slots=True)
class _Waiting:
    body: Any
    deadline_ms: int
    future: asyncio.Future[Any]
    # Event-loop time it arrived: its batch runs at the latest batch_wait_timeout_s after.
    arrived: float
    # Told the size of the batch it runs in (its handler span's attribute, when the replica traces).
    sized: Callable[[int], None] | None = None


class Batcher:
    """Collects the requests of one batched handler and runs them in batches, one batch at a time."""

    def __init__(self, name: str, config: BatchConfig, run: RunBatch, slots: Callable[[], int] | None = None) -> None:
        self.name = name
        self._config = config
        self._run_batch = run
        # The replica's max_ongoing_requests: a batch that holds them all is full, as no more can be read.
        self._slots = slots
        self._waiting: list[_Waiting] = []
        self._more = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._no_wait = False
        self.batches = 0
        self.items = 0

    def submit(self, body: Any, deadline_ms: int, sized: Callable[[int], None] | None = None) -> asyncio.Future[Any]:
        """Queue one body; the future resolves to its own output, or the error of its whole batch. ``sized`` is told
        the size of its batch when that runs."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append(_Waiting(body, deadline_ms, future, loop.time(), sized))
        self._more.set()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")
        return future

    @property
    def idle(self) -> bool:
        """Nothing waits and no batch runs."""
        return not self._waiting and self._task is None

    def flush_now(self) -> None:
        """Stop waiting for batches to fill (no more requests are coming: the replica drains)."""
        self._no_wait = True
        self._more.set()

    async def aclose(self) -> None:
        """Cancel a batch still running (the drain deadline passed) and what still waits."""
        for item in self._waiting:
            item.future.cancel()
        self._waiting.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        """Runs while requests wait; the next submit starts it again."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                size = self._config.max_batch_size
                if self._slots is not None:
                    size = max(1, min(size, self._slots()))
                flush_at = self._waiting[0].arrived + self._config.batch_wait_timeout_s
                while len(self._waiting) < size and not self._no_wait:
                    remaining = flush_at - loop.time()
                    if remaining <= 0:
                        break
                    self._more.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._more.wait(), remaining)
                batch = self._waiting[:size]
                del self._waiting[:size]
                await self._run(batch)
        finally:
            self._task = None

    async def _run(self, batch: list[_Waiting]) -> None:
        now = now_ms()
        ready = []
        for item in batch:
            if item.future.done():  # its request task was cancelled
                continue
            if item.deadline_ms and now > item.deadline_ms:
                item.future.set_exception(DeadlinePassed())
            else:
                ready.append(item)
        if not ready:
            return
        self.batches += 1
        self.items += len(ready)
        for item in ready:
            if item.sized is not None:
                item.sized(len(ready))
        try:
            outputs = check_outputs(self.name, len(ready), await self._run_batch([item.body for item in ready]))
        except Exception as exc:
            for item in ready:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        except BaseException:
            for item in ready:  # cancelled mid-batch: its request tasks must not wait forever
                item.future.cancel()
            raise
        for item, output in zip(ready, outputs, strict=True):
            if not item.future.done():
                item.future.set_result(output)


class Batchers:
    """The Batcher of each batched handler of one replica, made on the handler's first request."""

    def __init__(self, run: RunHandler, max_ongoing: Callable[[], int], label: str) -> None:
        self._run = run
        self._max_ongoing = max_ongoing
        self._label = label
        self._by_method: dict[tuple[str, str], Batcher] = {}

    async def call(
        self,
        method: str,
        handler: Handler,
        body: Any,
        deadline_ms: int,
        sized: Callable[[int], None] | None = None,
        model: str = "",
    ) -> Any:
        """Run ``body`` as part of a batch (of requests for ``model``) and return its own output; DeadlinePassed if it
        expired waiting. ``sized``: told the size of its batch."""
        batcher = self._by_method.get((method, model))
        if batcher is None:
            assert handler.batch is not None
            if len(self._by_method) >= IDLE_BATCHERS_KEPT:  # one per model asked for: those idle go
                self._by_method = {key: kept for key, kept in self._by_method.items() if not kept.idle}
            batcher = self._by_method[method, model] = self._make(_name(handler.fn), handler, handler.batch, model)
        return await batcher.submit(body, deadline_ms, sized)

    def _make(self, name: str, handler: Handler, config: BatchConfig, model: str) -> Batcher:
        limit = self._max_ongoing()
        if limit < config.max_batch_size:
            logger.warning(
                "replica %s: %s has max_batch_size %d but max_ongoing_requests is %d: batches hold at most %d",
                self._label,
                name,
                config.max_batch_size,
                limit,
                limit,
            )

        async def run(bodies: list[Any]) -> Any:
            return await self._run(handler, bodies, model)

        return Batcher(name if not model else f"{name} [{model}]", config, run, self._max_ongoing)

    def flush_now(self) -> None:
        """Run what waits without waiting for batches to fill (the replica drains)."""
        for batcher in self._by_method.values():
            batcher.flush_now()

    async def aclose(self) -> None:
        """Cancel batches still running and log what was batched."""
        for batcher in self._by_method.values():
            await batcher.aclose()
            if batcher.batches:
                logger.info(
                    "replica %s: %s ran %d requests in %d batches (%.1f on average)",
                    self._label,
                    batcher.name,
                    batcher.items,
                    batcher.batches,
                    batcher.items / batcher.batches,
                )


def _name(fn: Any) -> str:
    """``scale``, ``Model.predict``, or ``Model.__call__`` for an instance: for logs."""
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else f"{type(fn).__qualname__}.__call__"
