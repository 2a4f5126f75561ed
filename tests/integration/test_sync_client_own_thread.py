"""A done-callback of a ``Client.submit()`` future runs on the client's own thread: a blocking call made there, or a
wait for another submit()'s future, is refused at once (RuntimeError), not left waiting for the thread it blocks, and
the client goes on serving."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from streamserve.client import Client
from streamserve.runtime.settings import Settings
from tests import deployments
from tests.integration.conftest import StartReplica

# The chained call's own bound, and the test's bound on hearing from the callback at all.
CALL_TIMEOUT_S = 3.0
CALLBACK_WITHIN_S = 10.0


@pytest.mark.parametrize("blocking", ["call", "submit-result"])
async def test_a_blocking_call_in_a_submit_future_s_done_callback_raises_at_once(
    start_replica: StartReplica, settings: Settings, gate: None, blocking: str
) -> None:
    await start_replica(name="gate", import_path="tests.deployments:gate")
    client = Client(settings=settings)
    # Where the callback ran, and what its blocking call raised (None: nothing).
    heard: concurrent.futures.Future[tuple[str, BaseException | None]] = concurrent.futures.Future()

    def chain(_done: concurrent.futures.Future[Any]) -> None:
        try:
            if blocking == "call":
                client.call("gate", "chained", timeout=CALL_TIMEOUT_S)
            else:  # waiting for another call's future there: the client stopped for good
                client.submit("gate", "chained", timeout=CALL_TIMEOUT_S).result()
        except BaseException as exc:
            heard.set_result((threading.current_thread().name, exc))
        else:
            heard.set_result((threading.current_thread().name, None))

    try:
        first = client.submit("gate", "first", timeout=CALLBACK_WITHIN_S)
        first.add_done_callback(chain)  # before the gate opens: the client's thread completes the future
        deployments.GATE.set()
        thread, error = await asyncio.wait_for(asyncio.wrap_future(heard), CALLBACK_WITHIN_S)
        assert thread == "streamserve-client"
        assert isinstance(error, RuntimeError), error
        assert "client's own thread" in str(error)
        assert first.result() == "first"
        assert await asyncio.to_thread(client.call, "gate", "after", timeout=CALL_TIMEOUT_S) == "after"
    finally:
        await asyncio.to_thread(client.close)
