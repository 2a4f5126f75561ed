"""A call whose run may be shared (wire/shared_runs.py), from the caller's side: queue it, join the run on its way,
or take its stored reply; by an idempotency key, or as identical requests of a deployment with a response cache.

ENQUEUE_SHARED chooses, in one step, between those three. A call that joined
a run waits for the copy of its reply that whoever settles the run sends;
should that copy be lost (the replica died between settling and answering),
it looks at the record itself now and then: done, it takes the stored reply;
gone at two looks in a row, it sends the call again (gone at one look, the run
may just have ended without keeping its reply, a failed run of identical
requests: its copy is on its way). A RETRY reply (the run ended without
running) sends it again too, as a new run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from streamserve.client.tenant_limits import refusal, tenant_terms
from streamserve.metrics.definitions import CACHE_REQUESTS
from streamserve.transport.pipelining import Abandoned, Pipeliner, Script
from streamserve.wire import idempotency, response_cache, scripts, shared_runs
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import IdempotencyKeyMismatchError, NotFoundError, OverloadedError, ProtocolError
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms, text
from streamserve.wire.priorities import queue_full

_ENQUEUE_SHARED = Script(scripts.ENQUEUE_SHARED)
# A call that joined a run looks at the run's record after this long without its copy of the reply, then ever less
# often, up to every JOINED_CHECK_MAX_S.
JOINED_CHECK_FIRST_S = 1.0
JOINED_CHECK_MAX_S = 5.0
# A look at a run's record gives up after this long (a Redis that stopped answering held the call for half a minute).
RECORD_LOOK_S = 2.0
_RECORD_FIELDS = ("state", "digest", "status", "body", "error_type", "error_message", "replica", "too_large")
# The metrics field a cache's results are counted under, less the result (hit, miss, coalesced).
_CACHE_RESULTS = CACHE_REQUESTS.field("")


@dataclass(frozen=True, slots=True)
class Sharing:
    """Where a call's shared run is kept, and how to treat what is found there."""

    record: str
    waiters: str
    # The digest a record found must have: an idempotency key's request digest; "" for a cache entry (its key is
    # its digest).
    digest: str = ""
    # Count hit, miss and coalesced in the deployment's metrics (a cache).
    counted: bool = False
    # Run anew whatever the record holds, and keep the new reply (Cache-Control: no-cache).
    refresh: bool = False


def by_key(keys: Keys, cfg: DeploymentConfig, request: Request) -> Sharing:
    """The sharing of ``request``, which has an idempotency key (``idem``)."""
    return Sharing(
        *keys.shared_run(cfg.name, request.idem, "", request.tenant),
        digest=idempotency.request_digest(request.method, request.body, request.model),
    )


def by_cache(keys: Keys, cfg: DeploymentConfig, request: Request, refresh: bool, digest: str = "") -> Sharing:
    """The sharing of ``request`` to a deployment with a response cache; sets its ``cache`` digest (``digest``, when
    the caller made it already)."""
    request.cache = digest or response_cache.cache_digest(
        cfg, request.method, request.body, request.model, request.tenant
    )
    return Sharing(
        *keys.shared_run(cfg.name, "", request.cache),
        counted=True,
        refresh=refresh,
    )


@dataclass(slots=True)
class Admission:
    """What ENQUEUE_SHARED did with a call: queued it as the run (``entry_id``), had it join the run on its way
    (``joined``), or found the run's reply stored (``stored``: from the record's ``fields``, which Redis keeps
    ``kept_ms`` longer); ``runs_for`` the request that runs or ran for the run it found."""

    entry_id: str = ""
    joined: bool = False
    stored: Reply | None = None
    fields: list[bytes] | None = None
    kept_ms: int = 0
    # The id of the request that runs, or ran, for the call it joined or whose reply it took.
    runs_for: str = ""


async def enqueue_shared(
    pipeliner: Pipeliner,
    keys: Keys,
    cfg: DeploymentConfig,
    request: Request,
    sharing: Sharing,
    abandoned: Abandoned | None = None,
) -> Admission:
    """Queue ``request`` (with a fresh ``run``) as its shared run, or join that run or take its stored reply.

    OverloadedError when the queue is full, IdempotencyKeyMismatchError when an idempotency key ran for another
    method or body, ReplyNotStoredError when its reply was too large to keep. ``abandoned``: what to do with the
    script's answer should the caller be cancelled before it comes (Pipeliner.execute)."""
    hold_ms = max(request.deadline_ms - now_ms(), 0) + shared_runs.RUNNING_RECORD_GRACE_MS
    joiner = shared_runs.waiter(request.reply_to, request.tag, request.request_id) if request.reply_to else b""
    counter = _CACHE_RESULTS if sharing.counted else ""
    args: list[Any] = [cfg.max_queued_requests, CONSUMER_GROUP, sharing.digest, request.run, hold_ms, joiner]
    spec, tenant_keys = tenant_terms(keys, cfg, request) if cfg.tenant_limits else ("", [])
    args += [request.request_id, "1" if sharing.refresh else "", counter, spec]
    for field, value in request.encode().items():
        args += [field, value]
    run_keys = [keys.requests(cfg.name, request.priority), sharing.record, sharing.waiters, keys.metrics(cfg.name)]
    run_keys += tenant_keys
    # Sent again after a lost answer, the same script is safe: the record names this call's run, or holds its reply.
    found = await pipeliner.run_script(_ENQUEUE_SHARED, run_keys, args, abandoned=abandoned)
    outcome = text(found[0])
    if outcome == "queued":
        return Admission(entry_id=text(found[1]))
    if outcome == "waiting":
        return Admission(joined=True, runs_for=text(found[1]))
    if outcome == "stored":
        fields = found[1:7]
        reply = shared_runs.stored_reply(fields, request.request_id, request.tag)
        return Admission(stored=reply, fields=fields, kept_ms=int(found[7]), runs_for=text(found[8]))
    if outcome == "full":
        raise OverloadedError(queue_full(cfg.name, cfg.max_queued_requests, request.priority))
    if outcome in ("rate", "tenant_full"):
        raise refusal(found, cfg, request)
    if outcome == "mismatch":
        raise IdempotencyKeyMismatchError(
            f"idempotency key {request.idem!r} was sent before with another method, model or body on deployment "
            f"{cfg.name!r}: a retry must repeat its request exactly, and a new request needs a new key"
        )
    raise ProtocolError(f"unexpected answer from the shared enqueue: {outcome!r}")


def queued_entry(answer: Any) -> bytes | None:
    """The entry id ENQUEUE_SHARED's ``answer`` says it queued the call as; None when it queued nothing (the call
    joined a run, took a stored reply, or was refused)."""
    return answer[1] if isinstance(answer, list) and answer and answer[0] == b"queued" else None


async def look_at_record(redis: aioredis.Redis, sharing: Sharing, request: Request) -> Reply | None:
    """For a call that joined a run and has waited long: the run's stored reply once it is done, RETRY when the
    record is gone (or names another request: the call sent again says so), None while it still runs (or when Redis
    does not answer within RECORD_LOOK_S)."""
    try:
        async with asyncio.timeout(RECORD_LOOK_S):
            raw = await redis.hmget(sharing.record, _RECORD_FIELDS)
    except TimeoutError:
        return None
    state, digest, *stored = cast(list[bytes | None], raw)
    if state is not None and (digest or b"") == sharing.digest.encode():
        if state.decode() != shared_runs.DONE:
            return None
        return shared_runs.stored_reply([value or b"" for value in stored], request.request_id, request.tag)
    return Reply(request.request_id, ReplyStatus.RETRY, "", tag=request.tag)


async def wait_joined(
    redis: aioredis.Redis,
    sharing: Sharing,
    request: Request,
    fut: asyncio.Future[Reply],
    deployment: str,
    deleted: Callable[[], bool],
) -> Reply:
    """The reply of the run ``request`` joined: its copy (``fut``), or what the record says once that is slow.
    NotFoundError once ``deleted()`` says ``deployment`` is gone (its run will never end)."""
    delay = JOINED_CHECK_FIRST_S
    gone_before = False
    while True:
        done, _ = await asyncio.wait([fut], timeout=delay)
        if done:
            return fut.result()
        if deleted():
            raise NotFoundError(
                f"deployment {deployment!r} was deleted while request {request.request_id} waited for an identical "
                "request (or one with its idempotency key)"
            )
        found = await look_at_record(redis, sharing, request)
        gone = found is not None and found.status is ReplyStatus.RETRY
        if found is not None and (gone_before or not gone):
            return found
        gone_before = gone
        delay = min(delay * 2, JOINED_CHECK_MAX_S)
