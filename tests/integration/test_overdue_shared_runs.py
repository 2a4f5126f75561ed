"""A keyed request whose sync handler runs on past its deadline keeps its key for as long as it runs: a retry joins
that run, and gets its reply, instead of running the handler a second time once the key's record would have lapsed
(its deadline plus shared_runs.RUNNING_RECORD_GRACE_MS)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire import shared_runs
from streamserve.wire.errors import RequestTimeoutError
from streamserve.wire.messages import now_ms
from streamserve.workers import serving
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

GRACE_MS = 1000  # (60 s in earnest)
TIMEOUT_S = 0.3


async def test_a_key_whose_sync_handler_overruns_its_deadline_is_kept_until_it_returns(
    start_replica: StartReplica,
    client: AsyncClient,
    aredis: aioredis.Redis,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shared_runs, "RUNNING_RECORD_GRACE_MS", GRACE_MS)
    monkeypatch.setattr(serving, "OVERDUE_RUNS_SWEEP_S", 0.1)
    deployments.CALLS.clear()
    deployments.OVERRUN_GATE.clear()
    replica = await start_replica(import_path="tests.deployments:overrun", max_ongoing_requests=4)
    record = settings.keys.idempotency("rec", "k-overrun")
    waiters = settings.keys.idempotency_waiters("rec", "k-overrun")
    sent_at = now_ms()
    with pytest.raises(RequestTimeoutError):
        await client.call("rec", "once", timeout=TIMEOUT_S, idempotency_key="k-overrun")
    lapse_at = sent_at + TIMEOUT_S * 1000 + GRACE_MS  # when the record lapsed, its handler still running
    retry = asyncio.ensure_future(client.call("rec", "once", timeout=10, idempotency_key="k-overrun"))
    try:
        await wait_for_async(lambda: aredis.llen(waiters), 5, "the retry did not join the run")
        replica.request_stop()  # and it drains: the handler runs on, and so must its record

        async def outlived() -> bool:
            return now_ms() > lapse_at + 300 and await aredis.exists(record, waiters) == 2

        await wait_for_async(outlived, 10, "the key's record, or its waiters, lapsed while its handler ran")
    finally:
        deployments.OVERRUN_GATE.set()
    assert await retry == "once"  # the retry that joined it is answered when it ends
    assert deployments.CALLS == ["once"]  # the handler ran once
    async with AsyncClient(settings=settings) as later:  # (its replica gone: the kept reply answers)
        assert await later.call("rec", "once", idempotency_key="k-overrun", timeout=5) == "once"
    assert deployments.CALLS == ["once"]
