"""How the scheduler answers SIGTERM and SIGINT: within a second, whatever its loop is doing.

The first signal asks for the graceful stop: the tick in progress ends at its next deployment, then the job workers
drain, and (``--stop-replicas-on-exit``) the replicas are stopped, for as long as that takes. The signal is caught
with ``signal.signal``, whose handler Python runs between two bytecodes of whatever the main thread is doing, and not
with ``loop.add_signal_handler``, whose callback waits until the event loop is free: a tick stuck in synchronous work
would hold it off for as long as it runs. The handler only notes the signal; a watchdog thread hands the request to
the loop and waits ANSWER_WITHIN_S for the loop to take it. A loop that does not is stuck, and the process exits at
once, with status 128 + the signal's number, as if the signal had not been caught: the leader lock expires by
itself, job workers get SIGTERM from the kernel (``die_with_parent``), and replicas, which outlive a scheduler by
design, are adopted by the next one (under ``streamserve up``, they leave with ``up``).

A second signal exits at once in the same way, whatever the first one started.

STOP_JOBS_SIGNAL, which `up` sends as it begins to stop, is caught the same way (JobsStopSignal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from streamserve.runtime.lifeline import STOP_JOBS_SIGNAL

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long the event loop has to take a stop request before the process exits without it.
ANSWER_WITHIN_S = 1.0
# How long the last log line may take to be written (a main thread stuck inside logging holds its lock).
LAST_WORDS_S = 0.5


class StopSignals:
    """While inside: SIGTERM and SIGINT call ``request_stop`` on the running loop, or end the process (see above)."""

    def __init__(self, request_stop: Callable[[], None], answer_within_s: float = ANSWER_WITHIN_S) -> None:
        self._request_stop = request_stop
        self._answer_within_s = answer_within_s
        self._loop = asyncio.get_running_loop()
        self._signalled = threading.Event()  # set by the first signal, or on the way out (then ``_done`` is too)
        self._taken = threading.Event()  # the loop has the request
        self._done = False
        self._signum = 0
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        self._watchdog = threading.Thread(target=self._watch, name="stop-signal-watchdog", daemon=True)

    def __enter__(self) -> StopSignals:
        self._watchdog.start()
        self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._done = True
        self._signalled.set()  # the watchdog, still waiting for a first signal, ends

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Runs in the main thread, between two bytecodes of whatever it was doing: notes the signal, no more."""
        if self._signalled.is_set():
            _exit_now(128 + signum, f"scheduler: {signal.Signals(signum).name} again: exiting at once")
        self._signum = signum
        self._signalled.set()

    def _watch(self) -> None:
        self._signalled.wait()
        if self._done:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is on its way out already
            self._loop.call_soon_threadsafe(self._take)
        if self._taken.wait(self._answer_within_s):
            return
        name = signal.Signals(self._signum).name
        _exit_now(
            128 + self._signum,
            f"scheduler: {name}: the event loop has been busy for {self._answer_within_s:g} s without taking the "
            "stop request (a tick in synchronous work); exiting at once",
        )

    def _take(self) -> None:
        """On the loop: the graceful stop begins."""
        self._taken.set()
        if not self._done:
            logger.info("scheduler: %s: stopping (a second signal exits at once)", signal.Signals(self._signum).name)
            self._request_stop()


def _exit_now(code: int, message: str) -> None:
    """Log ``message`` and end the process with ``code`` at once; within LAST_WORDS_S even if the log line cannot be
    written."""
    threading.Timer(LAST_WORDS_S, os._exit, (code,)).start()
    logger.error(message)
    os._exit(code)


class JobsStopSignal:
    """STOP_JOBS_SIGNAL (runtime/lifeline.py), from `up` as it begins to stop: no job is to start any more.

    Taken from the start of ``main``: `up` starts the scheduler with the signal blocked, so one sent while Python
    starts waits until then, and one taken before the scheduler runs is handed to it when it does (``attach``).
    """

    def __init__(self) -> None:
        self._requested = False
        self._on_request: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        signal.signal(STOP_JOBS_SIGNAL, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_JOBS_SIGNAL})

    def attach(self, on_request: Callable[[], None]) -> None:
        """On the running loop: call ``on_request`` there once the signal comes (at once if it came already)."""
        self._loop = asyncio.get_running_loop()
        self._on_request = on_request
        if self._requested:
            on_request()

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        """Runs in the main thread, between two bytecodes: notes the request and hands it to the loop."""
        self._requested = True
        if self._loop is not None and self._on_request is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is on its way out
                self._loop.call_soon_threadsafe(self._on_request)
