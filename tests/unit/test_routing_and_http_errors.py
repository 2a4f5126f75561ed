from __future__ import annotations

import pytest

from streamserve.app.errors import status_for
from streamserve.app.gateway import REQUEST_ID_RE
from streamserve.app.routing import RouteTable
from streamserve.wire.errors import (
    BadRequestError,
    DeadLetterError,
    NotFoundError,
    OverloadedError,
    RemoteError,
    RequestTimeoutError,
    StreamServeError,
    UnavailableError,
)


def test_longest_prefix_wins_and_segments_matter() -> None:
    table = RouteTable({"/a": "short", "/a/b": "long", "/echo": "echo"})
    assert table.match("/a/b/c") == "long"
    assert table.match("/a/x") == "short"
    assert table.match("/echo") == "echo"
    assert table.match("/echo/") == "echo"
    assert table.match("/echoes") is None
    assert table.match("/") is None
    assert RouteTable({"/": "root"}).match("/anything") == "root"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotFoundError("x"), 404),
        (BadRequestError("x"), 400),
        (RequestTimeoutError("x"), 504),
        (OverloadedError("x"), 503),
        (UnavailableError("x"), 503),
        (RemoteError("ValueError", "x"), 500),
        (DeadLetterError("ValueError", "x"), 500),
        (StreamServeError("x"), 500),
    ],
)
def test_http_status_table(error: StreamServeError, status: int) -> None:
    assert status_for(error) == status


def test_a_request_id_with_a_trailing_newline_is_not_taken() -> None:
    """An id is echoed in a header and logged: "$" would let "abc\\n" through, which could forge a log line."""
    assert REQUEST_ID_RE.match("abc-1.2:3") and not REQUEST_ID_RE.match("abc\n")
