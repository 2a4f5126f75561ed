"""The one table that maps streamserve errors to HTTP responses."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError

from streamserve.transport.connections import RedisRefusals
from streamserve.wire.errors import (
    BadRequestError,
    BodyTimeoutError,
    ConflictError,
    ForbiddenError,
    HeadersTooLargeError,
    IdempotencyKeyMismatchError,
    MethodNotAllowedError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ProtocolError,
    RateLimitedError,
    RedisUnavailableError,
    RemoteError,
    RequestTimeoutError,
    StreamServeError,
    TransferCodingError,
    UnauthorizedError,
    UnavailableError,
    UnsupportedMediaTypeError,
    URITooLongError,
    error_fields,
)

# Most specific first: the first class the error is an instance of decides the status.
STATUS_BY_ERROR: list[tuple[type[StreamServeError], int]] = [
    (NotFoundError, 404),
    (MethodNotAllowedError, 405),
    (PayloadTooLargeError, 413),
    (BodyTimeoutError, 408),
    (URITooLongError, 414),
    (HeadersTooLargeError, 431),
    (ConflictError, 409),
    (IdempotencyKeyMismatchError, 422),
    (UnauthorizedError, 401),
    (ForbiddenError, 403),
    (UnsupportedMediaTypeError, 415),
    (TransferCodingError, 501),
    (BadRequestError, 400),
    (RequestTimeoutError, 504),
    (RateLimitedError, 429),
    (OverloadedError, 503),
    (UnavailableError, 503),
    (RedisUnavailableError, 503),
    (RemoteError, 500),
    (ProtocolError, 502),
    (StreamServeError, 500),
]


async def handle_request_validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's own parameter errors (e.g. ``?wait=abc``) in our shape: 400 with the field and why."""
    assert isinstance(exc, RequestValidationError)
    message = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return await handle_streamserve_error(request, BadRequestError(message))


def redis_error_handler(refusals: RedisRefusals) -> Callable[[Request, Exception], Awaitable[Response]]:
    """FastAPI's handler for a Redis error on its routes (an admin write, a status read): 503 for a full Redis."""

    async def handle(request: Request, exc: Exception) -> Response:
        return error_response(refusals.meaning(exc) or StreamServeError(f"Redis: {exc}"), {})

    return handle


async def handle_client_disconnected(request: Request, exc: Exception) -> Response:
    """The client left mid-body: answer nothing it could read, and log no traceback."""
    return Response(status_code=400)


def json_response(body: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, headers=headers, media_type="application/json")


def status_for(exc: StreamServeError) -> int:
    return next(status for cls, status in STATUS_BY_ERROR if isinstance(exc, cls))


async def handle_streamserve_error(request: Request, exc: Exception) -> Response:
    """FastAPI's handler for any StreamServeError raised on its routes."""
    assert isinstance(exc, StreamServeError)
    return error_response(exc, {})


def error_response(exc: StreamServeError, headers: dict[str, str]) -> Response:
    """Render a StreamServeError as JSON ``{"error", "message"}`` with its status.

    ``headers`` are the reply headers known so far; with an ``X-Request-ID``
    among them (deployment routes), the body names the request too.
    """
    headers = dict(headers)
    body = error_fields(exc)
    if isinstance(exc, RemoteError) and exc.replica_id:
        headers["X-Replica"] = exc.replica_id
    if isinstance(exc, OverloadedError):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))  # whole seconds, never too early
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, BodyTimeoutError | HeadersTooLargeError | TransferCodingError):
        # A slow or oversized client gets no further request on this connection, nor one whose body's end cannot be
        # told from its coding.
        headers["Connection"] = "close"
    if isinstance(exc, MethodNotAllowedError):
        headers["Allow"] = ", ".join(exc.allow)
    if "X-Request-ID" in headers:
        body["request_id"] = headers["X-Request-ID"]
    return json_response(body, status_for(exc), headers)
