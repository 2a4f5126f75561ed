"""Shared runs: one run of a handler that several requests share, by an idempotency key or as identical requests
of a deployment with a response cache. What its record in Redis holds, and how its waiters are written.

The enqueue script (ENQUEUE_SHARED) looks at the run's record and, in the
same step:

- no record (or a cache refresh): the request is queued and the record made,
  naming this run (``run``, a token of the call);
- an idempotency key's record with another digest: refused (422);
- the run is still on its way: the caller joins its waiters, and gets a copy
  of its reply;
- the run is done: the caller gets the stored reply at once.

Whoever ends a run settles it (SETTLE_RUN): the replica that served it, the
caller that cancelled it while queued, the reclaimer that dead-lettered it.
Its reply is stored (wire/idempotency.py and wire/response_cache.py say
which replies are), or the record is deleted so that the next request runs;
either way the waiters get a copy of the reply, or RETRY when the handler
never ran to its end (they then send their calls again).

A record, as ``redis-cli HGETALL`` shows it: ``state`` (``running`` or
``done``), ``digest`` (idempotency keys), ``run``, ``request_id`` and
``entry`` (of the request that runs for it); once done also ``status``,
``body``, ``replica``, ``stored_ms``, ``error_type`` and ``error_message``
(an error's only), ``too_large`` (the size of a reply too large to keep,
which is then not stored), and ``joined`` once a caller joined its waiters.
"""

from __future__ import annotations

import itertools
import os
import secrets

import orjson

from streamserve.wire.errors import ProtocolError, ReplyNotStoredError
from streamserve.wire.messages import SHARED_STORED, Reply, ReplyStatus, now_ms

# A record is kept this much longer than its request's timeout while the request waits or runs, and while its handler
# runs on past that deadline (a sync handler's replica keeps it: KEEP_RUN); one that dies with every replica holding
# it frees its record when this lapses.
RUNNING_RECORD_GRACE_MS = 60_000

# What a record's ``state`` is.
RUNNING = "running"
DONE = "done"

# How SETTLE_RUN ends a run: keep the reply, or delete the record.
STORE = "store"
RELEASE = "release"


def canonical_body(body: bytes) -> bytes:
    """A JSON body written with sorted keys and no spaces, so that curl's and the Python client's forms of one
    value agree; the bytes themselves when they are not JSON."""
    try:
        return orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS) if body else b""
    except orjson.JSONDecodeError:  # the replica refuses it; the bytes tell its retries apart
        return body


_RUN_PREFIX = secrets.token_hex(8) + "-"
_RUN_COUNT = itertools.count()


def _new_run_prefix() -> None:
    """A forked child takes a prefix of its own (it would otherwise count on from its parent's tokens)."""
    global _RUN_PREFIX
    _RUN_PREFIX = secrets.token_hex(8) + "-"


os.register_at_fork(after_in_child=_new_run_prefix)


def new_run_token() -> str:
    """The token naming one call's run (its record's ``run``): this process's random prefix and a count, unique
    across processes without a system call per token."""
    return f"{_RUN_PREFIX}{next(_RUN_COUNT):x}"


def waiter(reply_to: str, tag: str, request_id: str) -> bytes:
    """A caller waiting for a run, as its waiters list holds it."""
    return orjson.dumps([reply_to, tag, request_id])


def waiters(raw: list[bytes]) -> list[tuple[str, str, str]]:
    """The waiters SETTLE_RUN returned, as (reply_to, tag, request id); a malformed one is skipped."""
    found = []
    for item in raw:
        try:
            reply_to, tag, request_id = orjson.loads(item)
        except (ValueError, TypeError):
            continue
        if type(reply_to) is type(tag) is type(request_id) is str:
            found.append((reply_to, tag, request_id))
    return found


def stored_fields(reply: Reply) -> list[str | bytes]:
    """The fields SETTLE_RUN stores for ``reply``: an error's only for an error (a missing one reads as empty)."""
    fields: list[str | bytes] = ["status", reply.status.value, "replica", reply.replica_id, "stored_ms", str(now_ms())]
    fields += ["body", reply.body]
    if reply.error_type or reply.error_message:
        fields += ["error_type", reply.error_type, "error_message", reply.error_message]
    return fields


def stored_reply(raw: list[bytes], request_id: str, tag: str) -> Reply:
    """The reply ENQUEUE_SHARED found stored (status, body, error_type, error_message, replica, too_large), as the
    reply to this caller's request; ReplyNotStoredError when it was too large to keep."""
    try:
        status, body, error_type, error_message, replica, too_large = raw
        if too_large:
            raise ReplyNotStoredError(
                "the request that first sent this idempotency key ran, but its reply was not stored: "
                f"{too_large.decode(errors='replace')}"
            )
        return Reply(
            request_id,
            ReplyStatus(status.decode()),
            replica.decode(),
            body=body,
            error_type=error_type.decode(),
            error_message=error_message.decode(errors="replace"),
            tag=tag,
            shared=SHARED_STORED,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed shared-run record: {exc}") from exc
