"""docs/tutorial.md, "Batching": a batch is at most ``min(max_batch_size, max_ongoing_requests)``, and "the replica
logs a warning when ``max_ongoing_requests`` is the smaller". Checked on a real replica serving a ``@streamserve.batch``
handler (``max_batch_size=8``), with pytest's caplog."""

from __future__ import annotations

import logging

import pytest

from streamserve.client import AsyncClient
from tests import deployments
from tests.integration.conftest import StartReplica

BATCHER_LOGGER = "streamserve.workers.batcher"
# tests.deployments.batched_fn's.
MAX_BATCH_SIZE = 8


@pytest.mark.parametrize(("max_ongoing_requests", "warned"), [(4, True), (7, True), (8, False), (16, False)])
async def test_the_replica_warns_once_when_max_ongoing_requests_is_below_max_batch_size(
    start_replica: StartReplica,
    client: AsyncClient,
    caplog: pytest.LogCaptureFixture,
    max_ongoing_requests: int,
    warned: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger=BATCHER_LOGGER)
    deployments.BATCH_SIZES.clear()
    replica = await start_replica(import_path="tests.deployments:batched_fn", max_ongoing_requests=max_ongoing_requests)
    for n in range(3):
        assert await client.call("rec", n, timeout=10) == {"in": n, "size": 1}
    assert deployments.BATCH_SIZES == [1, 1, 1]  # the handler did run batched, on this replica

    warnings = [r for r in caplog.records if r.name == BATCHER_LOGGER and r.levelno == logging.WARNING]
    if not warned:
        assert warnings == []
        return
    [warning] = warnings  # once, not once per request or batch
    message = warning.getMessage()
    assert replica.replica_id.to_str() in message
    assert "batched_fn" in message
    assert f"max_batch_size {MAX_BATCH_SIZE}" in message
    assert f"max_ongoing_requests is {max_ongoing_requests}" in message
    assert f"batches hold at most {max_ongoing_requests}" in message
