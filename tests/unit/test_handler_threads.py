"""HandlerThreads: sync handlers' outcomes reach the loop; blocking ones fan out up to the limit, never past it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from streamserve.workers.threads import HandlerThreads
from tests.harness.waiting import wait_for_async

WAIT_S = 10.0  # bound on every wait below: a hand-off that never happens fails the test instead of hanging it


class Gate:
    """Jobs that block until released, counting how many run at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.release = threading.Event()

    def job(self, value: Any) -> Any:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if not self.release.wait(WAIT_S):
                raise TimeoutError("never released")
            return value
        finally:
            with self._lock:
                self.running -= 1


async def until(condition: Callable[[], bool]) -> None:
    await wait_for_async(condition, WAIT_S, interval_s=0.005)


def alive(name: str) -> int:
    """Threads of the HandlerThreads made with ``name`` still running."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(f"{name}-") and t.is_alive())


async def test_results_and_exceptions_reach_their_callers() -> None:
    threads = HandlerThreads(4)
    try:
        results = await asyncio.gather(*(threads.run(lambda x: x * 2, i) for i in range(100)))
        assert results == [i * 2 for i in range(100)]

        def fail(body: Any) -> None:
            raise ValueError(f"bad {body}")

        with pytest.raises(ValueError, match="bad 7"):
            await threads.run(fail, 7)
    finally:
        threads.close()


async def test_a_handler_raising_stop_iteration_fails_its_request_instead_of_hanging_it() -> None:
    threads = HandlerThreads(1)
    try:
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(threads.run(lambda _: next(iter(())), None), WAIT_S)
    finally:
        threads.close()


async def test_blocking_handlers_each_get_a_thread_up_to_the_limit_and_no_more() -> None:
    gate, threads = Gate(), HandlerThreads(4)
    try:
        futures = [threads.run(gate.job, i) for i in range(10)]
        await until(lambda: gate.running == 4)  # all four threads took a job while the first ones still block
        gate.release.set()
        assert await asyncio.gather(*futures) == list(range(10))
        assert gate.most == 4
    finally:
        threads.close()


async def test_resize_up_runs_more_at_once_and_down_lets_idle_threads_go() -> None:
    gate, threads = Gate(), HandlerThreads(2, name="resized")
    try:
        futures = [threads.run(gate.job, i) for i in range(6)]
        await until(lambda: gate.running == 2)
        threads.resize(5)
        futures.append(threads.run(gate.job, 6))  # new work finds room for three more threads
        await until(lambda: gate.running == 5)
        gate.release.set()
        await asyncio.gather(*futures)
        assert gate.most == 5
        await until(lambda: alive("resized") == 5)
        threads.resize(1)
        await until(lambda: alive("resized") == 1)
        assert await threads.run(lambda x: x, "still serving") == "still serving"
    finally:
        threads.close()


async def test_close_cancels_queued_jobs_drops_running_ones_and_its_threads_exit() -> None:
    gate, threads = Gate(), HandlerThreads(1, name="closed")
    running = threads.run(gate.job, "running")
    queued = threads.run(gate.job, "queued")
    await until(lambda: gate.running == 1)
    threads.close()
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        threads.run(gate.job, "late")
    gate.release.set()
    await until(lambda: alive("closed") == 0)  # the busy job ran to its end, then its thread left
    # Its outcome was dropped, not handed to the loop: the request stays pending in Redis for another replica.
    assert not running.done()
