"""An AsyncClient used in one ``asyncio.run()`` and again in the next without ``aclose()`` (a module-level client
with a loop per test): every use on the new loop says what happened and what to do, never waits out its timeout,
and ``aclose()`` lets it start again on the loop that runs then."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from tests.integration.conftest import StartReplica

CALL_TIMEOUT_S = 5.0
# A use on a new loop must fail well before the call's own timeout: it sends nothing.
REFUSED_WITHIN_S = 2.0


def in_a_loop_of_its_own(use: Callable[[], Awaitable[Any]]) -> Any:
    """``use()`` run by an asyncio.run() of its own, bounded by REFUSED_WITHIN_S beyond the call's timeout."""

    async def bounded() -> Any:
        return await asyncio.wait_for(use(), CALL_TIMEOUT_S + REFUSED_WITHIN_S)

    return asyncio.run(bounded())


def loops_one_after_another(client: AsyncClient) -> None:
    def call() -> Awaitable[Any]:
        return client.call("rec", "x", timeout=CALL_TIMEOUT_S)

    assert in_a_loop_of_its_own(call)["body"] == "x"  # its loop ends here, the client left open
    for _ in range(3):  # every time, not only the first
        with pytest.raises(RuntimeError, match="started on an event loop that has ended: close it before"):
            in_a_loop_of_its_own(call)
        with pytest.raises(RuntimeError, match="started on an event loop that has ended"):
            in_a_loop_of_its_own(client.status)
    in_a_loop_of_its_own(client.aclose)  # forgets the old loop's connections
    assert in_a_loop_of_its_own(call)["body"] == "x"  # started anew on this loop...
    in_a_loop_of_its_own(client.aclose)  # ...and closed with it


async def test_an_async_client_used_on_a_new_loop_without_aclose_says_why_until_aclose(
    start_replica: StartReplica, settings: Settings
) -> None:
    await start_replica()
    client = AsyncClient(settings=settings)
    # The connections the first loop left open (it ended without aclose()) can only be dropped, and the collector may
    # take them at any moment from then on: their ResourceWarnings are this test's, wherever the collector runs, and
    # they are collected here, not in the next test, which would see the warnings as its own.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        await asyncio.to_thread(loops_one_after_another, client)
        for _ in range(3):
            gc.collect()


async def test_a_client_started_again_after_aclose_reads_a_reply_stream_of_its_own(
    start_replica: StartReplica, settings: Settings, aredis: Any
) -> None:
    """A call cut off by aclose() may still be answered: on the reply stream a client started again reads, its late
    reply, matched by its tag (counted from 1 again), would have been taken for a new call's answer."""
    await start_replica(route_prefix="/rec")
    client = AsyncClient(settings=settings)
    await client.call("rec", 1)
    first = settings.keys.reply_stream(client.caller_id)
    await client.aclose()
    try:
        assert (await client.call("rec", 2))["body"] == 2
        again = settings.keys.reply_stream(client.caller_id)
        assert again != first
        assert await aredis.exists(again) == 1 and await aredis.exists(first) == 0  # (the old one is not made again)
    finally:
        await client.aclose()
