"""The one exception hierarchy of streamserve, grouped by who must react."""

from __future__ import annotations

from typing import Any

# The most characters of a caller's value that an error message repeats (a header may be 64 KiB).
SHOWN_MAX_CHARS = 100


def shown(value: object) -> str:
    """``value`` as an error message names it: its repr, cut after SHOWN_MAX_CHARS characters with how long it is."""
    text = repr(value)
    if len(text) <= SHOWN_MAX_CHARS:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as written"
    return f"{text[:SHOWN_MAX_CHARS]}... ({size})"


class StreamServeError(Exception):
    """Root of every error streamserve raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its ``args`` and attributes, rebuilt without calling ``__init__``: an error whose ``__init__``
        takes other arguments than its ``args`` (RemoteError's four) could not be unpickled, and a multiprocessing
        pool or a ProcessPoolExecutor whose worker raised it hung or broke."""
        return _rebuilt, (type(self), self.args), self.__dict__ or None


def _rebuilt(cls: type[StreamServeError], args: tuple[object, ...]) -> StreamServeError:
    """An unpickled ``cls`` with its ``args``, before its attributes are set back (see StreamServeError.__reduce__)."""
    return cls.__new__(cls, *args)


# -- the caller sent something wrong ------------------------------------------


class BadRequestError(StreamServeError):
    """The caller's input is invalid (not JSON, bad header, bad argument)."""


def streaming_only_message(deployment: str, method: str) -> str:
    """What a call that waits for one result is told of a streaming handler: by its replica, which does not run it,
    and by the client, when the reply found is a stream (an idempotency key's run made by stream())."""
    named = f" (method {method!r})" if method else ""
    return (
        f"deployment {deployment!r}{named} streams its answer: call it with Client.stream() or AsyncClient.stream() "
        "(a handle's stream() or astream())"
        + ("" if method else ", or over HTTP")
        + "; call(), submit() and jobs take one result"
    )


class ConfigError(BadRequestError):
    """A config file or config value is invalid; the message names the field."""


class UnauthorizedError(BadRequestError):
    """An admin write without the right API key."""


class ForbiddenError(BadRequestError):
    """An admin write the gateway refuses whoever sends it: admin writes switched off (STREAMSERVE_ADMIN=off), no
    token configured, or a ``Host`` or ``Origin`` it does not serve; or a job cancel for another tenant's job."""


class UnsupportedMediaTypeError(BadRequestError):
    """An admin write whose body is not ``application/json``, or a body sent in a content coding (gzip, br): the
    gateway takes bodies as they are, and would read a compressed one as if it were not."""


class TransferCodingError(BadRequestError):
    """A request body in a transfer coding other than ``chunked`` alone (``gzip, chunked``): the gateway decodes no
    other, and would read the body still coded."""


class NotFoundError(BadRequestError):
    """No deployment, endpoint or route by that name."""


class MethodNotAllowedError(BadRequestError):
    """A route was asked with a method it does not answer; ``allow`` lists those it does."""

    def __init__(self, message: str, allow: tuple[str, ...] = ("POST",)) -> None:
        super().__init__(message)
        self.allow = allow


class PayloadTooLargeError(BadRequestError):
    """The request body is larger than ``max_request_bytes``."""


class BodyTimeoutError(BadRequestError):
    """The request body did not arrive within ``body_timeout_s``."""


class HeaderTimeoutError(BodyTimeoutError):
    """The request's headers did not all arrive within ``header_timeout_s`` (a 408, like a body that is late)."""


class HeadersTooLargeError(BadRequestError):
    """The request's headers together are larger than ``max_header_bytes``."""


class URITooLongError(HeadersTooLargeError):
    """The request's URL is longer than the gateway's HTTP parser takes (65,535 bytes)."""


class ConflictError(BadRequestError):
    """The write would break something that depends on the current state (e.g. an endpoint's traffic)."""


class IdempotencyKeyMismatchError(BadRequestError):
    """A request reused an idempotency key with another method, model or body than the request that first sent it."""


class ReplyNotStoredError(ConflictError):
    """The request that first sent an idempotency key ran, but its reply was too large to keep for the retries."""


# -- the wire or Redis is broken ----------------------------------------------


class ProtocolError(StreamServeError):
    """A message in Redis could not be decoded (wrong schema or corrupt)."""


class RedisUnavailableError(StreamServeError):
    """Redis could not be reached after the retry policy gave up."""


# -- the deployment cannot serve right now ------------------------------------


class UnavailableError(StreamServeError):
    """The deployment has no replica and cannot get one."""


class OverloadedError(UnavailableError):
    """The deployment's queue is full; retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RateLimitedError(OverloadedError):
    """The request's tenant is over its rate or its share of the deployment's queue (tenant_limits); retry after
    ``retry_after_s`` seconds."""


class RequestTimeoutError(StreamServeError):
    """No reply before the request's deadline (or a goal not reached in time)."""


class RequestCancelledError(StreamServeError):
    """The request was cancelled before it ended: its caller stopped waiting, its job was cancelled, or (for a call
    made through a handle) the request whose handler made it was cancelled."""


class GoalFailedError(StreamServeError):
    """A deploy, scale or delete could not be reached (e.g. the import failed); the message says why."""


# -- the user's code failed -----------------------------------------------------


class RemoteError(StreamServeError):
    """The deployment's handler raised; carries the user's exception type and message."""

    def __init__(self, error_type: str, message: str, replica_id: str = "", traceback: str | None = None) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message
        self.replica_id = replica_id
        self.traceback = traceback


class ResponseTooLargeError(StreamServeError):
    """A handler's result above its deployment's ``max_response_bytes``, or more than Redis had memory for; the caller
    gets it as a RemoteError."""


class DeadLetterError(RemoteError):
    """The request was delivered ``max_delivery_attempts`` times and moved to the dead-letter stream."""


class BatchOutputError(StreamServeError):
    """A ``@batch`` handler did not return one output per input; every request of that batch fails with it.

    Raised in the replica (callers see it as a RemoteError whose ``error_type`` is ``BatchOutputError``)
    and when a decorated function is called directly.
    """


def error_fields(exc: StreamServeError) -> dict[str, str]:
    """``{"error", "message"}`` as callers see the error: the user's own type and message for a RemoteError."""
    if isinstance(exc, RemoteError):
        return {"error": exc.error_type, "message": exc.message}
    return {"error": type(exc).__name__, "message": str(exc)}


__all__ = [
    "BadRequestError",
    "BatchOutputError",
    "BodyTimeoutError",
    "ConfigError",
    "ConflictError",
    "DeadLetterError",
    "ForbiddenError",
    "GoalFailedError",
    "HeaderTimeoutError",
    "HeadersTooLargeError",
    "IdempotencyKeyMismatchError",
    "MethodNotAllowedError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "ProtocolError",
    "RateLimitedError",
    "RedisUnavailableError",
    "RemoteError",
    "ReplyNotStoredError",
    "RequestCancelledError",
    "RequestTimeoutError",
    "ResponseTooLargeError",
    "StreamServeError",
    "TransferCodingError",
    "URITooLongError",
    "UnauthorizedError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
]
