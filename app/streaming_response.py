"""A deployment POST answered by a streaming handler: 200, then its chunks as they come, as NDJSON or as SSE.

NDJSON (``application/x-ndjson``, the default): one JSON value per line. SSE (``text/event-stream``, when the
request's ``Accept`` names it): each chunk is ``data: <json>`` and a blank line.

What came while the response waits for chunks (all that one read of the reply stream brought) is written on the
socket at once by the reply reader, in one write (``write``: ChunkFeed.sink), with no wake-up of this task. When the
socket cannot take it (its client reads slowly), this task is woken and writes with an ASGI send, and takes more
from the feed only once that send returned: a slow HTTP reader slows the replica, through the feed's progress
messages (flow control), and nothing piles up in the gateway.

How a stream ends:
- well: the response ends as any chunked response does;
- with an error (the handler raised, the deadline passed, ...): SSE writes ``event: error`` with
  ``data: {"error", "message", "request_id"}`` and ends normally; NDJSON writes that object as its last line and
  then cuts the connection without the chunked body's end, so that an NDJSON client can tell a stream that failed
  from one that ended (its HTTP client reports an incomplete body; the last line says why);
- the client went away: writing stops and the request is forgotten;
- the client stopped reading, and a write still waits ``STUCK_WRITE_GRACE_S`` past the deadline: the error (a
  ``RequestTimeoutError``) is put behind what the connection holds, without waiting, to end the stream as above
  once the client reads on; one that has not read it all ``STUCK_LINGER_S`` later is cut.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from collections.abc import Callable

import orjson
from starlette.types import Receive, Send

from streamserve.app.bodies import ClientDisconnected
from streamserve.app.errors import status_for
from streamserve.app.observe import CLIENT_CLOSED
from streamserve.client.chunk_feed import ChunkFeed
from streamserve.wire.errors import RequestTimeoutError, StreamServeError, UnavailableError, error_fields

NDJSON = b"application/x-ndjson"
SSE = b"text/event-stream"
# A write still waiting this long after the stream's deadline (its client stopped reading) ends the stream.
STUCK_WRITE_GRACE_S = 1.0
# Such a stream's end waits behind what its connection holds for at most this long; then the connection is cut.
STUCK_LINGER_S = 10.0


class StreamCut(Exception):
    """Raised once a stream's response cannot end well (an NDJSON stream's error line is written, or a write is stuck
    past the deadline), so that the server closes the connection without the chunked body's end. ``status``: what
    the request is counted and logged as."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def wants_sse(accept_headers: list[str]) -> bool:
    """Whether the request's ``Accept`` headers prefer ``text/event-stream`` to NDJSON: it is named with a weight
    (``q``, 1 by default) above 0, and ``application/x-ndjson`` is not named with a higher one. A media range with a
    malformed weight counts as not named."""
    weights: dict[str, float] = {}
    for header in accept_headers:
        for item in header.split(","):
            media, _, params = item.partition(";")
            media = media.strip().lower()
            if media in _STREAM_MEDIA and media not in weights and (weight := _weight(params)) is not None:
                weights[media] = weight
    sse = weights.get("text/event-stream", 0.0)
    return sse > 0 and sse >= weights.get("application/x-ndjson", 0.0)


def stream_headers(sse: bool, request_id: str, deployment: str, replica_id: str) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", SSE if sse else NDJSON),
        (b"x-request-id", request_id.encode()),
        (b"x-deployment", deployment.encode()),
        (b"x-replica", replica_id.encode()),
    ]
    if sse:
        headers.append((b"cache-control", b"no-cache"))
    return headers


async def stream_response(
    send: Send,
    receive: Receive | None,
    feed: ChunkFeed,
    headers: list[tuple[bytes, bytes]],
    sse: bool,
    request_id: str,
    write: Callable[[bytes], bool] | None = None,
    begin: Callable[[list[tuple[bytes, bytes]], bytes], bool] | None = None,
    end_stuck: Callable[[bytes, bool], bool] | None = None,
) -> int:
    """Answer with ``feed``'s chunks until its end, then close it; the status the request is counted as (200, or
    the error's, or CLIENT_CLOSED). Raises StreamCut where the connection must be cut (see the module).

    ``receive``: watched for the client's leaving, which fails ``feed``; None where the server fails it itself
    (http_protocol.when_gone: no task per stream).

    ``write``: writes one body chunk on the socket at once, or says False (http_protocol.write_chunk); given, the
    chunks that come while this waits for them are written by the reply reader itself (ChunkFeed.sink). ``begin``:
    starts the response with the chunks that came with the first reply, in one write, or says False
    (http_protocol.start_chunked). ``end_stuck``: ends the response whose client stopped reading with a last chunk
    (and the body's end, when told so) without waiting, or says False (http_protocol.end_stuck_stream)."""
    frame = _sse_frame if sse else _ndjson_frame
    watcher = None if receive is None else asyncio.create_task(_watch_disconnect(receive, feed))
    stuck_at = None if math.isinf(feed.deadline) else feed.deadline + STUCK_WRITE_GRACE_S
    try:
        async with asyncio.timeout_at(stuck_at):
            if begin is None or not feed.write_now(lambda batch: begin(headers, frame(batch))):
                await send({"type": "http.response.start", "status": 200, "headers": headers})
            if write is not None:
                feed.sink = lambda batch: write(frame(batch))
            while True:
                try:
                    batch = await feed.next_batch()
                except ClientDisconnected:
                    return CLIENT_CLOSED
                except StreamServeError as exc:
                    return await _end_with_error(send, exc, sse, request_id)
                if batch is None:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return 200
                await send({"type": "http.response.body", "body": frame(batch), "more_body": True})
    except TimeoutError:
        error = RequestTimeoutError(f"the client read too slowly to take the stream before its deadline ({request_id})")
        held: list[bytes] = []  # the chunks that came before the deadline, which the client has not been given
        feed.write_now(functools.partial(_keep, held, frame))
        if end_stuck is not None and end_stuck(b"".join(held) + _error_chunk(error, sse, request_id), sse) and sse:
            return status_for(error)
        raise StreamCut(status_for(error), str(error)) from None
    except asyncio.CancelledError:
        # uvicorn cancels what still runs once its graceful shutdown has timed out (its request is cancelled in the
        # replica, as for a caller who left): the stream ends with why, as after an error, without waiting.
        stopped = UnavailableError(
            f"the gateway stopped before stream {request_id} ended: the request was cancelled; send it again"
        )
        if end_stuck is not None:
            end_stuck(_error_chunk(stopped, sse, request_id), sse)
        raise
    finally:
        feed.sink = None
        if watcher is not None:
            watcher.cancel()
        feed.close()


async def _end_with_error(send: Send, exc: StreamServeError, sse: bool, request_id: str) -> int:
    """After chunks, an error: SSE's error event and a normal end, or NDJSON's error line and a cut."""
    status = status_for(exc)
    if sse:
        await send({"type": "http.response.body", "body": _error_chunk(exc, sse, request_id)})
        return status
    await send({"type": "http.response.body", "body": _error_chunk(exc, sse, request_id), "more_body": True})
    raise StreamCut(status, f"stream {request_id} ended with {exc!r}")


def _keep(into: list[bytes], frame: Callable[[bytes], bytes], batch: bytes) -> bool:
    into.append(frame(batch))
    return True


def _error_chunk(exc: StreamServeError, sse: bool, request_id: str) -> bytes:
    """The error that ends a stream after chunks: SSE's error event, or NDJSON's last line."""
    error = orjson.dumps({**error_fields(exc), "request_id": request_id})
    return b"event: error\ndata: " + error + b"\n\n" if sse else error + b"\n"


async def _watch_disconnect(receive: Receive, feed: ChunkFeed) -> None:
    """End the stream as soon as its client goes away (the request body was read: what comes now is that)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    feed.fail(ClientDisconnected())


def _ndjson_frame(batch: bytes) -> bytes:
    return batch + b"\n"


def _sse_frame(batch: bytes) -> bytes:
    return b"data: " + batch.replace(b"\n", b"\n\ndata: ") + b"\n\n"


_STREAM_MEDIA = ("text/event-stream", "application/x-ndjson")
# A weight as RFC 9110 writes it: 0 to 1, at most three decimals.
_QVALUE_RE = re.compile(r"^(0(\.\d{0,3})?|1(\.0{0,3})?)\Z")


def _weight(params: str) -> float | None:
    """A media range's weight from its parameters (``q``, 1 without one); None when it is malformed."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            value = value.strip()
            return float(value) if _QVALUE_RE.match(value) else None
    return 1.0


class _QuietStreamCuts(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" for a StreamCut (a cut made on purpose, not a failure) and
    for a CancelledError: what uvicorn cancels itself once its graceful shutdown timed out (a stream still open),
    which its own line says ("Cancel 1 running task(s), timeout graceful shutdown exceeded"); its callers' requests
    are cancelled in the replicas as for a caller who left."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut | asyncio.CancelledError))


_QUIET = _QuietStreamCuts()


def quiet_stream_cuts() -> None:
    """Keep uvicorn from logging the cuts of failed NDJSON streams as errors (once per process is enough)."""
    logging.getLogger("uvicorn.error").addFilter(_QUIET)  # adding it again does nothing
