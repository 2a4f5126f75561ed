"""Handles' pure parts: a child call's id and timeout, and what a handle refuses before it sends anything."""

from __future__ import annotations

import asyncio

import pytest

import streamserve
from streamserve.client.handles import (
    MAX_REQUEST_ID_CHARS,
    child_request_id,
    child_timeout_s,
    close_handles,
    serve_handles_on,
)
from streamserve.errors import BadRequestError, RequestCancelledError, RequestTimeoutError
from streamserve.runtime.request_scope import RequestScope
from streamserve.runtime.settings import Settings
from streamserve.wire.messages import now_ms


def test_a_child_id_starts_with_its_parents() -> None:
    assert child_request_id("req-42", 7) == "req-42.7"


def test_a_child_id_too_long_for_a_request_id_is_a_fresh_one() -> None:
    parent = "p" * (MAX_REQUEST_ID_CHARS - 2)
    assert child_request_id(parent, 9) == parent + ".9"  # exactly the limit
    fresh = child_request_id(parent, 10)
    assert not fresh.startswith(parent) and 0 < len(fresh) <= MAX_REQUEST_ID_CHARS


@pytest.mark.parametrize(
    ("deployment_s", "remaining_s", "expected"),
    [
        (30.0, None, 30.0),  # no parent deadline: the child deployment's own
        (30.0, 1.5, 1.5),  # the parent's time left is shorter
        (2.0, 10.0, 2.0),  # the child deployment's timeout is shorter
    ],
)
def test_a_child_timeout_is_the_shorter_of_its_own_and_its_parents_time_left(
    deployment_s: float, remaining_s: float | None, expected: float
) -> None:
    assert child_timeout_s(deployment_s, remaining_s) == expected


def test_no_time_left_is_a_timeout_at_once() -> None:
    with pytest.raises(RequestTimeoutError, match="nothing was sent"):
        child_timeout_s(30.0, 0.0)


def _in_handler(scope: RequestScope, body: object) -> object:
    """``handle("child").call(body)`` as a sync handler serving ``scope`` would make it."""
    return scope.context().run(streamserve.handle("child").call, body)


def test_a_call_for_a_request_past_its_deadline_fails_without_sending() -> None:
    """(Nothing is sent: this unit test may open no socket.)"""
    scope = RequestScope("parent", now_ms() - 1)
    with pytest.raises(RequestTimeoutError):
        _in_handler(scope, {"x": 1})


def test_a_call_for_a_cancelled_request_fails_without_sending() -> None:
    scope = RequestScope("parent", now_ms() + 60_000)
    scope.cancel()
    with pytest.raises(RequestCancelledError):
        _in_handler(scope, {"x": 1})
    with pytest.raises(RequestCancelledError):
        scope.context().run(streamserve.handle("child").stream, 1)


def test_a_body_json_cannot_hold_is_refused_before_sending() -> None:
    with pytest.raises(BadRequestError, match="JSON"):
        streamserve.handle("child").call(float("nan"))
    with pytest.raises(BadRequestError, match="JSON"):
        streamserve.handle("child").stream({1, 2})


async def test_a_blocking_call_on_the_replicas_own_loop_says_to_await_acall() -> None:
    serve_handles_on(asyncio.get_running_loop(), Settings())
    try:
        with pytest.raises(RuntimeError, match=r"await handle\.acall"):
            streamserve.handle("child").call({"x": 1})
        with pytest.raises(RuntimeError, match=r"async for chunk in handle\.astream"):
            streamserve.handle("child").stream({"x": 1})
    finally:
        await close_handles()


@pytest.mark.parametrize("name", ["", "Echo", "a b", "x" * 64])
def test_a_handle_on_a_name_no_deployment_could_have_is_refused_at_once(name: str) -> None:
    with pytest.raises(BadRequestError, match="is not a valid name"):
        streamserve.handle(name)
