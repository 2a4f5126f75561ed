from __future__ import annotations

import pytest

from streamserve.transport.backoff import Backoff


def test_delays_double_up_to_the_cap_and_reset() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.failures == 5
    backoff.reset()
    assert (backoff.next(), backoff.failures) == (0.5, 1)


@pytest.mark.parametrize(("first", "cap"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 5.0)])
def test_nonsense_bounds_are_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="first"):
        Backoff(first, cap)
