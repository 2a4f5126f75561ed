"""Cancellation from the caller's side: a request its caller stops waiting for before its end is cancelled.

One CANCEL script (wire/scripts.py) finds where the request is. Still queued, it
is deleted there and never runs. Held by a replica, it is marked (so that the
reclaimer drops it should that replica die) and a CancelRequest goes to that
replica's control stream, which stops its handler. Finished, nothing happens.

A shared run (an idempotency key's, or identical requests' of a response cache:
wire/shared_runs.py) is cancelled only while queued, when its key is freed and
its retry runs. Once it runs it belongs to the key, not to the caller who
left: its reply is what the retry of a caller who lost the connection comes
for, and what the requests that joined it wait for. So it runs to its end, a
stream without waiting for a reader (told that everything was read).

A cancellation is sent in the background: whoever stops waiting (a cancelled
task, a closed stream, an HTTP caller gone) does not wait for it. One that
cannot reach Redis (away, or hanging) is tried again until the request's
deadline (past it no replica starts the request) or the client's close; one
that fails otherwise, or for good, is logged, and the request then runs to its
end, unanswered.

An enqueue that failed with Redis away or hanging may have reached it all the
same, and a Redis that hangs queues what it had read once it goes on: such a
request is looked for until found (and cancelled), or found absent twice, a
moment apart (the second look comes after all that Redis had read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.typing import EncodableT

from streamserve.metrics.definitions import CANCELLED, QUEUED_STAGE
from streamserve.transport import settling
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS, retrying_stopped
from streamserve.transport.pipelining import Command, Pipeliner, Script
from streamserve.transport.streams import control_command
from streamserve.wire import scripts
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import READ_ALL, CancelRequest, ReadProgress, Request, now_ms, text
from streamserve.wire.priorities import lane_ref, priority_lane, split_ref

logger = logging.getLogger(__name__)

_CANCEL = Script(scripts.CANCEL)
# How long past its deadline a request cancelled while a replica held it stays marked (the reclaimer drops marked
# entries): a replica never starts a request past its deadline, so a mark is of no use after it; the margin covers
# clocks that differ between hosts.
CANCEL_MARK_MARGIN_MS = 60_000
# How long the mark of a request without a deadline is kept.
CANCEL_MARK_KEEP_MS = 24 * 3600 * 1000
# A cancellation (or a look for a request whose enqueue failed) that cannot reach Redis is tried again at most this
# far apart.
CANCEL_RETRY_CAP_S = 1.0
# A request whose enqueue failed, not found where it would be queued, is looked for once more this much later.
DOUBTFUL_LOOK_AGAIN_S = 1.0


class Canceller:
    """Cancels requests of one client, each in a task of its own that nobody awaits (``aclose`` waits for them)."""

    def __init__(self, redis: aioredis.Redis, pipeliner: Pipeliner, keys: Keys) -> None:
        self._redis = redis
        self._pipeliner = pipeliner
        self._keys = keys
        self._tasks: set[asyncio.Task[str]] = set()
        self._closed = False

    def cancel_soon(self, deployment: str, entry_id: str, request: Request) -> None:
        """Cancel ``request`` in the background; nothing once the client has closed (a stream left open then, dropped
        later, may call this outside any event loop)."""
        if self._closed:
            return
        self._in_background(self._cancel_persistently(deployment, entry_id, request))

    def find_and_cancel_soon(self, deployment: str, request: Request, find: Callable[[], Sequence[Command]]) -> None:
        """Look for ``request``, whose enqueue failed though it may have reached Redis, in the background, and
        cancel it if it is (or gets) queued. ``find``: the commands whose one reply is its entry id (or ref),
        "answered" (it ran), or nothing (not there)."""
        if self._closed:
            return
        self._in_background(self._find_and_cancel(deployment, request, find))

    def _in_background(self, cancelling: Coroutine[Any, Any, str]) -> None:
        task = asyncio.create_task(cancelling)
        self._tasks.add(task)
        task.add_done_callback(self._sent)

    async def _cancel_persistently(self, deployment: str, entry_id: str, request: Request) -> str:
        """``cancel``, tried again while Redis cannot be reached, until the request's deadline or the close."""
        backoff = Backoff(cap=CANCEL_RETRY_CAP_S)
        while True:
            try:
                return await self.cancel(deployment, entry_id, request.request_id, request)
            except RETRYABLE_ERRORS as exc:
                await self._pause_or_raise(request, exc, backoff)

    async def _find_and_cancel(self, deployment: str, request: Request, find: Callable[[], Sequence[Command]]) -> str:
        backoff = Backoff(cap=CANCEL_RETRY_CAP_S)
        absent_before = False
        while True:
            try:
                [found] = await self._pipeliner.execute(*find())
            except RETRYABLE_ERRORS as exc:
                await self._pause_or_raise(request, exc, backoff)
                continue
            if isinstance(found, Exception):
                raise found
            if found == b"answered":
                return "finished"
            if isinstance(found, bytes):
                return await self._cancel_persistently(deployment, text(found), request)
            if absent_before:
                return "absent"
            absent_before = True
            await asyncio.sleep(DOUBTFUL_LOOK_AGAIN_S)

    async def _pause_or_raise(self, request: Request, error: Exception, backoff: Backoff) -> None:
        """After a try that could not reach Redis (``error``): wait for the next, or raise ``error`` when none is
        worth it (the client closed, the request's deadline passed: it can no longer be started, or this process's farm
        is gone, and its Redis with it: stop_retrying)."""
        if self._closed or retrying_stopped() or not 0 < now_ms() < request.deadline_ms:
            raise error
        delay = backoff.next()
        logger.info(
            "cancelling request %s: Redis did not answer (%s); again in %.1fs", request.request_id, error, delay
        )
        await asyncio.sleep(delay)

    async def cancel(self, deployment: str, entry_id: str, request_id: str, request: Request | None = None) -> str:
        """Cancel request ``request_id`` (entry ``entry_id`` of ``deployment``'s stream); where it was: "queued",
        "running", "finished", or for ``request``'s shared run, "runs_on" (it ran, and runs to its end). A queued
        shared run is freed."""
        keys = self._keys
        lane, entry = split_ref(entry_id.encode())  # a routed entry comes as its ref (Calls._add)
        if not lane and request is not None:
            lane = priority_lane(request.priority)
        ref = lane_ref(lane, entry).decode()
        shared = request is not None and bool(request.run)
        now = now_ms()
        deadline_ms = request.deadline_ms if request is not None else 0
        mark_until = deadline_ms + CANCEL_MARK_MARGIN_MS if deadline_ms else now + CANCEL_MARK_KEEP_MS
        script_keys = [keys.lane_stream(deployment, lane), keys.cancelled(deployment), keys.metrics(deployment)]
        args: list[EncodableT] = [
            CONSUMER_GROUP,
            entry,
            now,
            mark_until,
            CANCELLED.field(QUEUED_STAGE),
            ref,
            int(shared),
        ]
        resent = False

        def again() -> list[Command]:
            nonlocal resent
            resent = True
            # Whole: a lost answer is often a restarted Redis, which knows no script any more.
            return [("EVAL", _CANCEL.source, len(script_keys), *script_keys, *args)]

        where = await self._pipeliner.run_script(_CANCEL, script_keys, args, again)
        stage = text(where[0])
        # Sent again after its answer was lost, "finished" may mean that the first sending deleted it while queued:
        # what follows a queued request's cancel is then done all the same. For one that really finished it does
        # nothing (its run is settled already, and its replica dropped its tenant's hold).
        queued = stage == "queued" or (stage == "finished" and resent)
        if stage == "runs_on" and request is not None and request.stream:
            # Nobody reads it any more: it must not wait at its window (flow control) until its deadline. (Should
            # this reach the replica before it has started the stream, it is dropped, and the stream waits.)
            control = keys.replica_control(deployment, text(where[1]))
            progress = ReadProgress(request_id, READ_ALL, request.tag)
            [added] = await self._pipeliner.execute(control_command(control, progress))
            if isinstance(added, Exception):
                raise added
        if queued and request is not None and request.run:
            await settling.release(self._redis, keys, deployment, request)
        if queued and request is not None and request.held:  # it no longer counts for its tenant
            await self._redis.zrem(keys.tenant_held(deployment, request.tenant), request.held)
        if stage == "running":
            control = keys.replica_control(deployment, text(where[1]))
            [added] = await self._pipeliner.execute(control_command(control, CancelRequest(ref, request_id)))
            if isinstance(added, Exception):
                raise added
        return stage

    def _sent(self, task: asyncio.Task[str]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.warning("could not cancel a request its caller stopped waiting for: %s", error)

    async def sent(self, within_s: float) -> None:
        """Wait (at most ``within_s``) for the cancellations on their way."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=within_s)

    async def aclose(self) -> None:
        """Wait for the cancellations on their way (before the connections close); start no more."""
        self._closed = True
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
