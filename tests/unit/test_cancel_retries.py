"""A cancellation that cannot reach Redis is tried again until its request's deadline, unless nothing is worth it:
the client closed, or this process's farm is gone and its Redis with it (stop_retrying): a gateway whose `up` was
killed went on trying its callers' cancellations, and outlived `up` by 10 s."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from streamserve.client.cancels import Canceller
from streamserve.transport import connections
from streamserve.transport.backoff import Backoff
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Request, now_ms

AWAY = RedisConnectionError("Connection refused (a test's)")


def canceller() -> Canceller:
    return Canceller(redis=Any, pipeliner=Any, keys=Keys())  # type: ignore[arg-type]  # (neither is used here)


def request_due_in(ms: int) -> Request:
    return Request("r1", "replies", now_ms() + ms, b"1")


async def test_a_cancellation_is_tried_again_before_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "_GIVEN_UP", threading.Event())
    await canceller()._pause_or_raise(request_due_in(60_000), AWAY, Backoff(0.001, 0.001))  # a pause, no error


async def test_a_cancellation_is_not_tried_again_once_the_farm_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "_GIVEN_UP", threading.Event())
    connections.stop_retrying()
    with pytest.raises(RedisConnectionError):
        await canceller()._pause_or_raise(request_due_in(60_000), AWAY, Backoff(0.001, 0.001))


async def test_a_cancellation_is_not_tried_again_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "_GIVEN_UP", threading.Event())
    with pytest.raises(RedisConnectionError):
        await canceller()._pause_or_raise(request_due_in(-1), AWAY, Backoff(0.001, 0.001))
