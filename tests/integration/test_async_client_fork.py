"""An AsyncClient started before os.fork() is the parent's: in the child its use says so (make one in the process
that uses it), instead of an internal error about futures on another loop; aclose() there lets it start anew in the
child, and the parent's client goes on working."""

from __future__ import annotations

import asyncio
import os

import pytest

from streamserve.client import AsyncClient
from tests.integration.conftest import StartReplica
from tests.integration.test_sync_client_fork import CALL_TIMEOUT_S, CHILD_WITHIN_S, exit_status

# The child's exit statuses.
TOLD_THEN_CALLED, NOT_TOLD, NOT_CALLED_AFTER_ACLOSE = 0, 2, 3


async def in_the_child(client: AsyncClient) -> int:
    """What the child sees: a call refused with the advice, then, after aclose(), a call that is answered."""
    try:
        await asyncio.wait_for(client.call("rec", "child", timeout=CALL_TIMEOUT_S), CALL_TIMEOUT_S)
        return NOT_TOLD
    except RuntimeError as exc:
        if "make an AsyncClient in the process that uses it" not in str(exc):
            return NOT_TOLD
    await client.aclose()
    try:
        answer = await client.call("rec", "child", timeout=CALL_TIMEOUT_S)
    finally:
        await client.aclose()
    return TOLD_THEN_CALLED if answer["body"] == "child" else NOT_CALLED_AFTER_ACLOSE


# (Python 3.12 warns of any fork in a process with threads, as pytest's is: the client's fork is the point here.)
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
async def test_an_async_client_started_before_fork_tells_the_child_to_make_its_own(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica()
    assert (await client.call("rec", "before", timeout=CALL_TIMEOUT_S))["body"] == "before"
    pid = os.fork()
    if pid == 0:
        status = NOT_TOLD
        try:
            status = asyncio.run(in_the_child(client))
        finally:
            os._exit(status)
    assert await exit_status(pid, CHILD_WITHIN_S) == TOLD_THEN_CALLED
    assert (await client.call("rec", "after", timeout=CALL_TIMEOUT_S))["body"] == "after"
