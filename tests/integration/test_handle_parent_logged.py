"""A call made through a handle carries its parent's request id to the replica (Request.parent), whose error log line
for it names the parent (``parent_request_id``), so that logs tie the two together."""

from __future__ import annotations

import logging

import pytest

from streamserve.client import AsyncClient
from streamserve.wire.errors import RemoteError
from streamserve.workers import serving
from tests.integration.conftest import StartReplica


async def test_the_handler_error_line_names_the_parent_request(
    start_replica: StartReplica, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    await start_replica()
    caplog.set_level(logging.ERROR, logger=serving.__name__)
    with pytest.raises(RemoteError):
        await client.call("rec", {"x": 1}, method="boom")
    reply = await client.request("rec", b'{"x": 2}', method="boom", request_id="parent-7.1", parent="parent-7")
    assert reply.error_type == "ValueError"
    records = [r for r in caplog.records if r.levelno == logging.ERROR and getattr(r, "request_id", None)]
    assert len(records) == 2, caplog.text
    without, child = records
    assert not hasattr(without, "parent_request_id")  # a call made by no handler has no parent
    assert child.request_id == "parent-7.1" and child.parent_request_id == "parent-7"  # type: ignore[attr-defined]
