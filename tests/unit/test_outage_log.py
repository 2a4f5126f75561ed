"""A loop that retries Redis every tick says it is away once, then once a minute, and once that it is back."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import AuthenticationError

from streamserve.transport.connections import OutageLog

REFUSED = "invalid username-password pair or user is disabled."


def test_an_outage_is_told_once_a_minute_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = [1000.0]
    outage = OutageLog(logging.getLogger("test"), "scheduler x", lambda: clock[0])
    caplog.set_level(logging.INFO, "test")
    outage.answered()  # (nothing was away: nothing to say)
    for _tick in range(5 * 150):  # 150 s of ticks 0.2 s apart
        outage.lost(AuthenticationError(REFUSED), "; hint")
        clock[0] += 0.2
    outage.answered()
    outage.answered()
    assert [r.getMessage() for r in caplog.records] == [
        f"scheduler x: Redis unavailable ({REFUSED}; hint); retrying",
        f"scheduler x: Redis still unavailable after 60s ({REFUSED}; hint); retrying",
        f"scheduler x: Redis still unavailable after 120s ({REFUSED}; hint); retrying",
        "scheduler x: Redis answers again after 150.0s",
    ]
