"""The threads a replica runs its sync handlers on, with cheap hand-offs to and from the event loop.

A sync handler must not block the loop (heartbeats, reads and replies run
there), so it runs on a thread. ``ThreadPoolExecutor`` made that hop a quarter
of a noop replica's CPU: each request woke an idle thread of its own (a burst
of 32 woke 32 threads, all contending for the GIL) and came back through a
``concurrent.futures.Future`` chained to an asyncio one, each with its own
wake-up of the loop. Here:

- A thread that finishes a job takes the next queued one without going back
  to sleep, and a job wakes an idle thread only when no other thread is
  already on its way to the queue. A woken thread that leaves jobs behind
  wakes the next, so blocking handlers still fan out to one thread each, up
  to the limit (``max_ongoing_requests``), while fast ones run back to back
  on one thread.
- Idle threads are woken last-in first-out (the warmest first).
- Results come back in batches: a thread wakes the loop only if no wake-up
  is already due, and the loop then settles every finished job at once.

Threads are daemons: a handler still stuck after the drain's grace period
does not keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from streamserve.workers.contained import as_exception, contained


class HandlerThreads:
    """Runs ``fn(arg)`` calls on up to ``size`` threads and hands their outcomes to the event loop."""

    def __init__(self, size: int, name: str = "handler") -> None:
        self._size = size
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._jobs: deque[tuple[Callable[[Any], Any], Any, asyncio.Future[Any]]] = deque()
        # Idle threads, each blocked on acquiring its own (held) lock; releasing it wakes that thread.
        self._parked: list[threading.Lock] = []
        # Threads woken (or started) that have not yet looked at the queue.
        self._waking = 0
        self._threads = 0
        self._closed = False
        self._done: deque[tuple[asyncio.Future[Any], bool, Any]] = deque()
        self._wake_due = False

    def run(self, fn: Callable[[Any], Any], arg: Any) -> asyncio.Future[Any]:
        """Queue ``fn(arg)``; the future gets its return value or its exception."""
        future: asyncio.Future[Any] = self._loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("handler threads are closed")
            self._jobs.append((fn, arg, future))
            start = self._wake_one_locked()
        if start:
            self._start_thread()
        return future

    def resize(self, size: int) -> None:
        """Allow ``size`` threads; idle threads beyond it exit now, busy ones when next idle."""
        with self._lock:
            self._size = size
            for _ in range(min(len(self._parked), self._threads - size)):
                self._waking += 1
                self._parked.pop(0).release()  # it finds itself over the limit and exits

    def close(self) -> None:
        """Take no more jobs; idle threads exit now, busy ones after their job; queued jobs are cancelled.

        The outcome of a job still running is dropped: its request stays pending in Redis, for the
        scheduler to hand to another replica. Call it from the event loop's thread.
        """
        with self._lock:
            self._closed = True
            dropped = list(self._jobs)
            self._jobs.clear()
            parked, self._parked = self._parked, []
            self._waking += len(parked)
        for lock in parked:
            lock.release()
        for _fn, _arg, future in dropped:
            future.cancel()

    def _wake_one_locked(self) -> bool:
        """Send a thread to the queue unless one is on its way; True: start a new one (outside the lock)."""
        if self._waking:
            return False  # it takes the job, or wakes another for it
        if self._parked:
            self._waking += 1
            self._parked.pop().release()
            return False
        if self._threads < self._size:
            self._waking += 1
            self._threads += 1
            return True
        return False  # every thread is busy: the first to finish takes the job

    def _start_thread(self) -> None:
        threading.Thread(target=self._work, name=f"{self._name}-{self._threads}", daemon=True).start()

    def _work(self) -> None:
        parking = threading.Lock()
        parking.acquire()
        woken = True  # started by a wake-up
        while True:  # each pass: this thread was just started or woken, or has just finished a job
            with self._lock:
                if woken:
                    self._waking -= 1
                    woken = False
                if self._closed or (self._threads > self._size and not self._jobs):
                    self._threads -= 1
                    return
                if not self._jobs:
                    self._parked.append(parking)
                    job = None
                else:
                    job = self._jobs.popleft()
                    start = bool(self._jobs) and self._wake_one_locked()  # more queued: fan out
            if job is None:
                parking.acquire()  # until run(), resize() or close() releases it
                woken = True
                continue
            if start:
                self._start_thread()
            fn, arg, future = job
            try:
                outcome: tuple[asyncio.Future[Any], bool, Any] = (future, True, fn(arg))
            except BaseException as exc:  # handed to the awaiting request, as an executor would
                outcome = (future, False, exc)
            self._settle_soon(outcome)

    def _settle_soon(self, outcome: tuple[asyncio.Future[Any], bool, Any]) -> None:
        self._done.append(outcome)
        with self._lock:
            if self._wake_due:
                return
            self._wake_due = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the outcome any more
            self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        with self._lock:
            self._wake_due = False
            if self._closed:
                self._done.clear()
                return
        while self._done:
            future, ok, value = self._done.popleft()
            if future.done():
                continue  # the request was cancelled
            if ok and inspect.iscoroutine(value):
                # A sync callable that returned a coroutine (a partial of an async function, say): run it too.
                asyncio.ensure_future(contained(value)).add_done_callback(functools.partial(_copy_outcome, future))
            elif ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a future refuses StopIteration: it means something to generators
                future.set_exception(RuntimeError(f"handler raised StopIteration: {value}"))
            else:
                future.set_exception(as_exception(value))  # (SystemExit raised from a future ends a task's loop)


def _copy_outcome(future: asyncio.Future[Any], task: asyncio.Future[Any]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())
