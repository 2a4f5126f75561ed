"""Idempotency keys: what a key may be, what its record in Redis holds, and which replies are kept for retries.

A call with an idempotency key runs its handler at most once per key and
deployment (for ``idempotency_ttl_s``). The enqueue script (ENQUEUE_KEYED)
looks at the key's record (Keys.idempotency) and, in the same step:

- no record: the request is queued and the record made, naming this run
  (``run``, a token of the call) and the digest of its method and body;
- the record has another digest: the caller gets 422 (the key was reused for
  another request);
- the run is still on its way: the caller joins its waiters
  (Keys.idempotency_waiters), and gets a copy of its reply;
- the run is done: the caller gets the stored reply at once.

Whoever ends a run settles it (SETTLE_RUN): the replica that served it, the
caller that cancelled it while queued, the reclaimer that dead-lettered it.
Its reply is stored when the handler ran to its end (a result, or the error
it raised); otherwise the record is deleted, so that a retry runs, and the
waiters are told to send their calls again (ReplyStatus.RETRY).

A record, as ``redis-cli HGETALL`` shows it: ``state`` (``running`` or
``done``), ``digest``, ``run``, ``request_id`` and ``entry`` (of the request
that runs for it); once done also ``status``, ``body``, ``error_type``,
``error_message``, ``replica``, ``stored_ms``, and ``too_large`` (the size of
a reply too large to keep, which is then not stored).
"""

from __future__ import annotations

import hashlib
import re
import secrets

import orjson

from streamserve.wire.errors import BadRequestError, ProtocolError, ReplyNotStoredError, ResponseTooLargeError
from streamserve.wire.messages import Reply, ReplyStatus, now_ms

# An idempotency key: 1-255 printable ASCII characters (spaces too).
KEY_RE = re.compile(r"[\x20-\x7e]{1,255}\Z")
# A record is kept this much longer than its request's timeout while the request waits or runs: a request is never
# run past its deadline, and one that dies with every replica holding it frees its key when this lapses.
RUNNING_RECORD_GRACE_MS = 60_000

# What a record's ``state`` is.
RUNNING = "running"
DONE = "done"

# How SETTLE_RUN ends a run.
STORE = "store"
RELEASE = "release"

# The replies whose handler ran to its end: kept for the retries. Every other end frees the key.
_STORED_STATUSES = frozenset({ReplyStatus.OK, ReplyStatus.USER_ERROR})


def check_key(key: str) -> str:
    """``key`` when it is a valid idempotency key; BadRequestError saying what one must be otherwise."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise BadRequestError(f"an idempotency key must be 1-255 printable ASCII characters, got {key!r}")
    return key


def request_digest(method: str, body: bytes) -> str:
    """What a retry must repeat to share a key's run: a digest of the method and the body's JSON value (written
    with sorted keys and no spaces, so that curl's and the Python client's forms of one value agree)."""
    try:
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS) if body else b""
    except orjson.JSONDecodeError:  # not JSON: the replica refuses it; the bytes tell its retries apart
        canonical = body
    return hashlib.sha256(method.encode() + b"\0" + canonical).hexdigest()[:32]


def new_run_token() -> str:
    """The token naming one call's run of a key (its record's ``run``)."""
    return secrets.token_hex(8)


def waiter(reply_to: str, tag: str, request_id: str) -> bytes:
    """A caller waiting for a key's run, as its waiters list holds it."""
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


def settlement(reply: Reply) -> tuple[str, list[str | bytes]]:
    """How a run that ended with ``reply`` is settled: (STORE, the record's fields and values) or (RELEASE, [])."""
    if reply.status not in _STORED_STATUSES:
        return RELEASE, []
    fields: list[str | bytes] = ["status", reply.status.value, "replica", reply.replica_id, "stored_ms", str(now_ms())]
    if reply.error_type == ResponseTooLargeError.__name__:
        # The result was too large to send, and so to keep: retries are told so (409), never run it again.
        return STORE, [*fields, "too_large", reply.error_message]
    return STORE, [*fields, "body", reply.body, "error_type", reply.error_type, "error_message", reply.error_message]


def stored_reply(raw: list[bytes], request_id: str, tag: str) -> Reply:
    """The reply ENQUEUE_KEYED found stored (status, body, error_type, error_message, replica, too_large), as the
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
            replayed=True,
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed idempotency record: {exc}") from exc
