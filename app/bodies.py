"""Reading a request body under the size limit, for the deployment routes and the admin API alike."""

from __future__ import annotations

import asyncio

from starlette.types import Receive

from streamserve.wire.errors import (
    BadRequestError,
    BodyTimeoutError,
    PayloadTooLargeError,
    TransferCodingError,
    UnsupportedMediaTypeError,
)


class ClientDisconnected(Exception):
    """The HTTP client went away before its request body arrived: nobody to answer."""


async def read_body(
    receive: Receive, content_length: str | None, limit: int, timeout_s: float, arrived: bool = False
) -> bytes:
    """The whole body; 413 as soon as it is known to pass ``limit`` (by Content-Length, or while it streams),
    408 if it has not all arrived within ``timeout_s`` (a slow client must not hold a connection forever).
    ``arrived``: the server has it all already (http_protocol.body_arrived), so nothing waits and no timer is set
    (the timer cost a small request a few percent of the gateway's CPU)."""
    declared = _declared_size(content_length)
    if declared is not None and declared > limit:
        shown_size = declared if declared < 2**64 else f"more than {limit}"
        raise PayloadTooLargeError(f"request body of {shown_size} bytes is above max_request_bytes ({limit})")
    if arrived:
        body = await _read(receive, limit)
    else:
        try:
            async with asyncio.timeout(timeout_s):
                body = await _read(receive, limit)
        except TimeoutError:
            raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g}s (body_timeout_s)") from None
    if declared is not None and len(body) != declared:
        # uvicorn stops reading a request at an Upgrade it does not take (curl --http2 sends "Upgrade: h2c"), and
        # hands over no body: it would have run as null.
        raise BadRequestError(
            f"the request body ended after {len(body)} of the {declared} bytes its Content-Length announced (a "
            "request with an Upgrade header, as curl --http2 sends, loses its body: send plain HTTP/1.1)"
        )
    return body


def check_content_coding(content_encodings: list[str]) -> None:
    """UnsupportedMediaTypeError (415) for a body in a content coding, a ``Content-Encoding`` other than ``identity``:
    the gateway decodes none, and read a compressed body as it came (a gzip one was "not UTF-8", a br one that
    happened to be JSON went to the handler)."""
    for coding in _codings(content_encodings):
        if coding != "identity":
            raise UnsupportedMediaTypeError(
                f"the request body is in the content coding {coding!r} (Content-Encoding): the gateway takes bodies "
                "unencoded; send it without one"
            )


def check_transfer_coding(transfer_encodings: list[str]) -> None:
    """TransferCodingError (501, RFC 9112, 6.1) for a ``Transfer-Encoding`` other than ``chunked`` alone: the gateway
    undoes the chunks and no other coding, and read ``gzip, chunked`` as if it were plain."""
    codings = _codings(transfer_encodings)
    if codings and codings != ["chunked"]:
        raise TransferCodingError(
            f"the request body is in the transfer coding {', '.join(codings)!r} (Transfer-Encoding): the gateway "
            "takes a body plain or chunked, in no other coding"
        )


def _codings(headers: list[str]) -> list[str]:
    """The codings that headers such as ``Content-Encoding: gzip, br`` name, in order, lower case."""
    return [coding.strip().lower() for header in headers for coding in header.split(",") if coding.strip()]


def _declared_size(content_length: str | None) -> int | None:
    """Content-Length as a number (None when absent or no number); leading zeros are allowed, and a value of
    thousands of digits (int() refuses those) is read as what it is: more than any limit."""
    if content_length is None or not (content_length.isascii() and content_length.isdigit()):
        return None
    digits = content_length.lstrip("0") or "0"
    return int(digits) if len(digits) <= 20 else 2**64


async def _read(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # chunked, or a Content-Length that understated it
            raise PayloadTooLargeError(f"request body is above max_request_bytes ({limit})")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
