"""What a reply stands for: the handler's result, or the StreamServeError a caller gets for it."""

from __future__ import annotations

from typing import Any

import orjson

from streamserve.wire.errors import (
    BadRequestError,
    DeadLetterError,
    NotFoundError,
    ProtocolError,
    RemoteError,
    RequestTimeoutError,
)
from streamserve.wire.messages import Reply, ReplyStatus

# The replies that start (or, with no chunk, are) a stream: the answer of a streaming handler.
STREAM_REPLIES = frozenset({ReplyStatus.CHUNK, ReplyStatus.END})


def kept_stream(reply: Reply) -> bool:
    """Whether ``reply`` is a stream kept for a shared run (an idempotency key's): its chunks are its body, and its
    status how it ended (END, or the error after them)."""
    return bool(reply.shared and reply.body and reply.status is not ReplyStatus.OK)


def result_of(reply: Reply) -> Any:
    """The handler's return value, or the error the reply stands for."""
    if reply.status is ReplyStatus.OK:
        return orjson.loads(reply.body)
    raise error_of(reply)


def error_of(reply: Reply) -> Exception:
    """The exception a reply that is not a result stands for (also the end of a stream that failed)."""
    if reply.status is ReplyStatus.DEADLINE_EXCEEDED:
        when = f"after {reply.seq} chunk(s)" if reply.seq else "before a replica could run it"
        return RequestTimeoutError(reply.error_message or f"request {reply.request_id} passed its deadline {when}")
    if reply.status is ReplyStatus.BAD_REQUEST:
        return BadRequestError(reply.error_message)
    if reply.status is ReplyStatus.DEAD_LETTER:
        return DeadLetterError(reply.error_type, reply.error_message, reply.replica_id)
    if reply.status is ReplyStatus.GONE:
        return NotFoundError(reply.error_message)
    if reply.status in STREAM_REPLIES:
        return ProtocolError(
            f"request {reply.request_id} got a stream reply ({reply.status.value}) where one answer was expected"
        )
    return RemoteError(reply.error_type, reply.error_message, reply.replica_id)
