"""X-Request-Timeout's parse takes time linear in the value's length: the header may hold 64 KiB, and a pattern that
backtracks over a long run of digits held the gateway's one event loop for minutes (37 s for 30,000 digits)."""

from __future__ import annotations

import pytest

from streamserve.app.gateway import _header_timeout
from streamserve.wire.errors import BadRequestError

# Bounds what a quadratic parse would take (minutes at this length), not how fast a linear one is (microseconds).
pytestmark = pytest.mark.timeout(10)

HEADER_MAX = 64 * 1024


@pytest.mark.parametrize("tail", ["x", ".x", "e", "e+", ".5e"])
def test_a_long_run_of_digits_that_is_no_number_is_refused_at_once(tail: str) -> None:
    with pytest.raises(BadRequestError, match="X-Request-Timeout must be a positive number"):
        _header_timeout(["1" * (HEADER_MAX - len(tail)) + tail])


def test_a_long_number_is_still_a_number() -> None:
    assert _header_timeout(["2." + "5" * (HEADER_MAX - 2)]) == 2.5555555555555554
