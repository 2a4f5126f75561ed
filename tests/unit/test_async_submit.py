"""``AsyncClient.submit()`` outside a running event loop raises at the call, instead of returning a task that never
runs (and that a later loop refuses to await: "The future belongs to a different loop")."""

from __future__ import annotations

import warnings

import pytest

from streamserve.client import AsyncClient


def test_submit_outside_an_event_loop_says_it_needs_one_and_leaves_no_call_behind() -> None:
    client = AsyncClient("redis://127.0.0.1:1")  # (connects at its first call: none is made here)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine made and dropped would warn "never awaited"
        with pytest.raises(RuntimeError, match=r"submit\(\) needs a running event loop: call it from a coroutine"):
            client.submit("echo", 1)
