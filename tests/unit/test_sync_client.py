"""``Client`` is ``AsyncClient`` made blocking: every public method has its twin, with AsyncClient's parameters."""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Callable

import pytest

from streamserve.client import AsyncClient, Client
from streamserve.client.sync_client import ASYNC_ONLY
from streamserve.errors import UnavailableError


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


TWINNED = sorted(public_names(AsyncClient) - ASYNC_ONLY)


def test_client_has_a_twin_of_every_public_method_of_async_client_but_the_async_only() -> None:
    assert public_names(AsyncClient) - ASYNC_ONLY - public_names(Client) == set()


def test_the_async_only_names_are_async_client_s_and_have_no_twin() -> None:
    assert ASYNC_ONLY - public_names(AsyncClient) == set()
    assert ASYNC_ONLY & public_names(Client) == set()


@pytest.mark.parametrize("name", TWINNED)
def test_a_twin_takes_async_client_s_parameters_and_has_a_docstring(name: str) -> None:
    twin, original = getattr(Client, name), getattr(AsyncClient, name)
    assert inspect.signature(twin).parameters == inspect.signature(original).parameters
    assert inspect.getdoc(twin)
    assert not inspect.iscoroutinefunction(twin)


def test_a_closed_client_refuses_every_kind_of_twin() -> None:
    client = Client("redis://127.0.0.1:1")
    client.close()
    with pytest.raises(UnavailableError, match=r"client closed: this Client was closed .*; make a new one"):
        client.scale("echo", 1)  # made from a coroutine method
    with pytest.raises(UnavailableError, match="client closed"):
        client.deployments()  # made from a local read
    with pytest.raises(UnavailableError, match="client closed"):
        client.submit("echo")  # written out


def test_every_blocking_kind_of_method_refuses_the_client_s_own_thread_before_it_sends() -> None:
    """What a done-callback of a submit() future would do: it runs on the client's loop thread (these refusals come
    before any connection, which a unit test may not open)."""
    client = Client("redis://127.0.0.1:1")
    attempts: dict[str, Callable[[], object]] = {
        "call": lambda: client.call("echo", 1),  # written out
        "send": lambda: client.send("echo", 1),
        "scale": lambda: client.scale("echo", 1),  # made from a coroutine method
        "deployments": client.deployments,  # made from a local read
        "stream": lambda: next(client.stream("echo", 1)),
        "close": client.close,
    }
    raised: concurrent.futures.Future[dict[str, str]] = concurrent.futures.Future()

    def on_the_client_s_thread() -> None:
        errors = {}
        for name, attempt in attempts.items():
            try:
                attempt()
            except RuntimeError as exc:
                errors[name] = str(exc)
        raised.set_result(errors)

    try:
        client._loop.call_soon_threadsafe(on_the_client_s_thread)
        errors = raised.result(timeout=5)
        assert errors.keys() == attempts.keys()
        assert all("client's own thread" in error for error in errors.values())
    finally:
        client.close()
