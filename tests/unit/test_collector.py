"""The scheduler process collects garbage on a timer, not automatically (scheduler/collector.py)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from streamserve.scheduler import collector
from tests.harness.waiting import wait_for_async


async def test_automatic_collection_is_off_while_it_runs_and_a_full_pass_comes_on_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes: list[int] = []
    monkeypatch.setattr(collector.gc, "collect", lambda: passes.append(1) or 0)
    task = asyncio.create_task(collector.collect_periodically(every_s=0.01))
    try:
        await wait_for_async(lambda: len(passes) >= 3, 5, "fewer than 3 passes", interval_s=0.01)
        assert not gc.isenabled()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert gc.isenabled()  # given back when the task ends
