"""A call with an idempotency key, from the caller's side: queue it, join the key's run, or take its stored reply.

See wire/idempotency.py for the key's record and the ENQUEUE_KEYED script
that chooses, in one step, between those three. A call that joined a run
waits for the copy of its reply that whoever settles the run sends; should
that copy be lost (the replica died between settling and answering), it looks
at the record itself now and then: done, it takes the stored reply; gone, it
sends the call again. A RETRY reply (the run ended without running) sends it
again too, as a new run of the key.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from streamserve.transport.pipelining import Pipeliner, Script
from streamserve.wire import idempotency, scripts
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import IdempotencyKeyMismatchError, OverloadedError, ProtocolError
from streamserve.wire.idempotency import DONE, RUNNING_RECORD_GRACE_MS
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms, text

_ENQUEUE_KEYED = Script(scripts.ENQUEUE_KEYED)
# A call that joined a run looks at the key's record after this long without its copy of the reply, then ever less
# often, up to every JOINED_CHECK_MAX_S.
JOINED_CHECK_FIRST_S = 1.0
JOINED_CHECK_MAX_S = 5.0
_RECORD_FIELDS = ("state", "digest", "status", "body", "error_type", "error_message", "replica", "too_large")


@dataclass(slots=True)
class Admission:
    """What ENQUEUE_KEYED did with a call: queued it as the key's run (``entry_id``), had it join the run on its
    way (``joined``), or found the run's reply stored (``stored``)."""

    entry_id: str = ""
    joined: bool = False
    stored: Reply | None = None


async def enqueue_keyed(pipeliner: Pipeliner, keys: Keys, cfg: DeploymentConfig, request: Request) -> Admission:
    """Queue ``request`` (its ``idem`` set, and a fresh ``run``) as its key's run, or join or replay the key's run.

    OverloadedError when the queue is full, IdempotencyKeyMismatchError when the key ran for another method or body,
    ReplyNotStoredError when its reply was too large to keep."""
    name, key = cfg.name, request.idem
    digest = idempotency.request_digest(request.method, request.body)
    hold_ms = max(request.deadline_ms - now_ms(), 0) + RUNNING_RECORD_GRACE_MS
    joiner = idempotency.waiter(request.reply_to, request.tag, request.request_id) if request.reply_to else b""
    args: list[Any] = [
        cfg.max_queued_requests,
        CONSUMER_GROUP,
        digest,
        request.run,
        hold_ms,
        joiner,
        request.request_id,
    ]
    for field, value in request.encode().items():
        args += [field, value]
    record_keys = [keys.requests(name), keys.idempotency(name, key), keys.idempotency_waiters(name, key)]
    # Sent again after a lost answer, the same script is safe: the record names this call's run, or holds its reply.
    found = await pipeliner.run_script(_ENQUEUE_KEYED, record_keys, args)
    outcome = text(found[0])
    if outcome == "queued":
        return Admission(entry_id=text(found[1]))
    if outcome == "waiting":
        return Admission(joined=True)
    if outcome == "stored":
        return Admission(stored=idempotency.stored_reply(found[1:], request.request_id, request.tag))
    if outcome == "full":
        raise OverloadedError(
            f"deployment {name!r} has {cfg.max_queued_requests} requests queued (max_queued_requests)"
        )
    if outcome == "mismatch":
        raise IdempotencyKeyMismatchError(
            f"idempotency key {key!r} was sent before with another method or body on deployment {name!r}: "
            "a retry must repeat its request exactly, and a new request needs a new key"
        )
    raise ProtocolError(f"unexpected answer from the keyed enqueue: {outcome!r}")


async def look_at_record(redis: aioredis.Redis, keys: Keys, deployment: str, request: Request) -> Reply | None:
    """For a call that joined its key's run and has waited long: the run's stored reply once it is done, RETRY when
    the key is free again (or ran for another request: the call sent again says so), None while it still runs."""
    raw = await redis.hmget(keys.idempotency(deployment, request.idem), _RECORD_FIELDS)
    state, digest, *stored = cast(list[bytes | None], raw)
    if state is not None and digest == idempotency.request_digest(request.method, request.body).encode():
        if state.decode() != DONE:
            return None
        return idempotency.stored_reply([value or b"" for value in stored], request.request_id, request.tag)
    return Reply(request.request_id, ReplyStatus.RETRY, "", tag=request.tag)


async def wait_joined(
    redis: aioredis.Redis, keys: Keys, deployment: str, request: Request, fut: asyncio.Future[Reply]
) -> Reply:
    """The reply of the run ``request`` joined: its copy (``fut``), or what the record says once that is slow."""
    delay = JOINED_CHECK_FIRST_S
    while True:
        done, _ = await asyncio.wait([fut], timeout=delay)
        if done:
            return fut.result()
        found = await look_at_record(redis, keys, deployment, request)
        if found is not None:
            return found
        delay = min(delay * 2, JOINED_CHECK_MAX_S)
