"""A handler that raises is logged by its replica at ERROR, with the request id and the traceback; the caller's
reply carries the error's type and message but no traceback (unless STREAMSERVE_DEBUG=1)."""

from __future__ import annotations

import logging

import pytest

from streamserve.client import AsyncClient
from streamserve.runtime.logging_setup import TextFormatter
from streamserve.wire.errors import RemoteError
from streamserve.workers import serving
from tests.integration.conftest import StartReplica


async def test_a_handler_error_is_logged_with_request_id_and_traceback(
    start_replica: StartReplica, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    replica = await start_replica()
    caplog.set_level(logging.ERROR, logger=serving.__name__)
    with pytest.raises(RemoteError) as raised:
        await client.call("rec", {"x": 1}, method="boom")
    assert "Traceback" not in str(raised.value) and "line " not in str(raised.value)
    records = [r for r in caplog.records if r.levelno == logging.ERROR and getattr(r, "request_id", None)]
    assert len(records) == 1, caplog.text
    record = records[0]
    assert len(record.request_id) >= 16  # type: ignore[attr-defined]
    assert record.deployment == "rec" and record.replica_id == replica.replica_id.to_str()  # type: ignore[attr-defined]
    line = TextFormatter().format(record)
    assert f"replica {replica.replica_id}" in line and f"request_id={record.request_id}" in line  # type: ignore[attr-defined]
    assert "Traceback (most recent call last)" in line and "in boom" in line and "ValueError: boom" in line
