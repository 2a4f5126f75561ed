"""The gateway's checks of a body (wire/json_values.check_body) and of its declared size (app/bodies.read_body): each
answers any body within the size limit with its verdict, in time linear in its size."""

from __future__ import annotations

from typing import Any

import pytest

from streamserve.app.bodies import read_body
from streamserve.wire.errors import PayloadTooLargeError
from streamserve.wire.json_values import MAX_DEPTH, check_body

# Bounds what a walk in Python would take over these bodies (tens of seconds), not how fast C-speed checks are.
pytestmark = pytest.mark.timeout(20)

MAX_BODY = 16 * 1024 * 1024  # max_request_bytes' default


def verdict(body: bytes) -> str:
    try:
        check_body(body)
    except ValueError as exc:
        return str(exc)
    return "ok"


def test_sixteen_megabytes_of_empty_lists_pass_in_time() -> None:
    body = b"[" + b",".join([b"[]"] * (MAX_BODY // 3)) + b"]"
    assert verdict(body) == "ok"


def test_a_long_run_of_digits_past_the_depth_limit_is_refused_for_its_depth() -> None:
    """Before, the integers were read first, by a parser that recursed past Python's limit (a 500)."""
    for depth in (MAX_DEPTH + 1, 980, 1020):
        body = b"[" * depth + b'"12345678901234567890"' + b"]" * depth
        assert verdict(body) == f"JSON nested deeper than {MAX_DEPTH} levels", depth
    assert verdict(b"[" * MAX_DEPTH + b"123456789012345678901" + b"]" * MAX_DEPTH).startswith("an integer outside")


@pytest.mark.parametrize(
    ("number", "fits"),
    [
        (b"18446744073709551615", True),
        (b"18446744073709551616", False),
        (b"-9223372036854775808", True),
        (b"-9223372036854775809", False),
        (b"1234567890123456789", True),
        (b"-123456789012345678", True),
        (b"1" * 5000, False),
        (b"0.12345678901234567890123", True),  # a float: as exact as floats are
    ],
)
def test_integers_beyond_64_bits_are_refused_and_digits_in_strings_are_not(number: bytes, fits: bool) -> None:
    assert (verdict(b"[1, " + number + b"]") == "ok") is fits
    assert verdict(b'{"id": "' + number + b'"}') == "ok"


def test_sixteen_megabytes_of_long_integers_pass_in_time() -> None:
    body = b"[" + b",".join([b"12345678901234567890"] * (MAX_BODY // 21)) + b"]"
    assert verdict(body) == "ok"


async def nothing() -> dict[str, Any]:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def test_a_content_length_with_thousands_of_leading_zeros_is_its_number() -> None:
    assert await read_body(nothing, "0" * 4400 + "2", 100, 1.0) == b"{}"
    with pytest.raises(PayloadTooLargeError, match="request body of more than 100 bytes"):
        await read_body(nothing, "9" * 4400, 100, 1.0)
    with pytest.raises(PayloadTooLargeError, match="request body of 101 bytes"):
        await read_body(nothing, "00101", 100, 1.0)
