"""Idempotency keys: what a key may be, what a retry must repeat, and which replies are kept for the retries.

A call with an idempotency key runs its handler at most once per key and
deployment (for ``idempotency_ttl_s``): its run is shared (wire/shared_runs.py)
through the key's record (Keys.idempotency). The record holds the digest of
the request's method and body, and another request with the key must have
the same one (else 422). A reply is kept when the handler ran to its end: a
result, or the error it raised. Any other end (cancelled, its deadline passed
before it started, dead-lettered) frees the key, so that a retry runs.
"""

from __future__ import annotations

import hashlib
import re

from streamserve.wire.errors import BadRequestError, ResponseTooLargeError, shown
from streamserve.wire.messages import Reply, ReplyStatus, now_ms
from streamserve.wire.shared_runs import RELEASE, STORE, canonical_body, stored_fields

# An idempotency key: 1-255 printable ASCII characters (spaces too).
# Printable ASCII, not beginning or ending with a space: HTTP drops spaces around a header's value (RFC 9110), so such a
# key would name another key over HTTP than from Python.
KEY_RE = re.compile(r"(?=[^ ])[\x20-\x7e]{1,255}(?<=[^ ])\Z")

# The replies whose handler ran to its end: kept for the retries (a stream's with its chunks as the body). Every other
# end frees the key.
_STORED_STATUSES = frozenset({ReplyStatus.OK, ReplyStatus.USER_ERROR, ReplyStatus.END})


def check_key(key: str) -> str:
    """``key`` when it is a valid idempotency key; BadRequestError saying what one must be otherwise."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise BadRequestError(
            f"an idempotency key must be 1-255 printable ASCII characters, not beginning or ending with a space, "
            f"got {shown(key)}"
        )
    return key


def request_digest(method: str, body: bytes, model: str = "") -> str:
    """What a retry must repeat to share a key's run: a digest of the method, the body's JSON value (and the model:
    wire/models.py)."""
    scope = method.encode() + (b"\0model\0" + model.encode() if model else b"")
    return hashlib.sha256(scope + b"\0" + canonical_body(body)).hexdigest()[:32]


def settlement(reply: Reply) -> tuple[str, list[str | bytes]]:
    """How a key's run that ended with ``reply`` is settled: (STORE, the record's fields and values) or
    (RELEASE, [])."""
    if reply.status not in _STORED_STATUSES:
        return RELEASE, []
    if reply.error_type == ResponseTooLargeError.__name__:
        # The result was too large to send, and so to keep: retries are told so (409), never run it again.
        return STORE, ["status", reply.status.value, "stored_ms", str(now_ms()), "too_large", reply.error_message]
    return STORE, stored_fields(reply)
