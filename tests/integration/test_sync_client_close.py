"""``Client.close()`` while other threads are in ``call()``: every call ends, with its result or UnavailableError,
and close() itself returns; none waits for ever on a loop that close() stopped."""

from __future__ import annotations

import asyncio
import threading

from streamserve.client import Client
from streamserve.errors import StreamServeError, UnavailableError
from streamserve.runtime.settings import Settings
from tests.harness.waiting import wait_for
from tests.integration.conftest import StartReplica

THREADS = 8
# Each trial closes the client after another number of answers, so that close() meets the calls at other points.
TRIALS = 30
# The calls' own timeout; a thread still calling this long after close() (and a margin) is stuck.
CALL_TIMEOUT_S = 5.0
ENDED_WITHIN_S = CALL_TIMEOUT_S + 3.0


def close_under_calls(settings: Settings, answers_before_close: int) -> list[str]:
    """THREADS threads call in a loop until a call raises; the client is closed once ``answers_before_close``
    answers came. What each thread's last call raised; AssertionError if a thread had not ended in time."""
    client = Client(settings=settings)
    answered = threading.Semaphore(0)
    ended: list[str] = []

    def calling() -> None:
        while True:
            try:
                client.call("rec", 1, timeout=CALL_TIMEOUT_S)
            except StreamServeError as exc:
                ended.append(f"{type(exc).__name__}: {exc}")
                return
            answered.release()

    threads = [threading.Thread(target=calling, daemon=True) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for _ in range(answers_before_close):
        assert answered.acquire(timeout=CALL_TIMEOUT_S), "the calls got no answer before close()"
    closing = threading.Thread(target=client.close, daemon=True)
    closing.start()
    wait_for(
        lambda: not closing.is_alive() and not any(thread.is_alive() for thread in threads),
        ENDED_WITHIN_S,
        lambda: (
            f"{sum(thread.is_alive() for thread in threads)} of {THREADS} calls, "
            f"{'and close(), ' if closing.is_alive() else ''}still waiting after close() "
            f"(closed after {answers_before_close} answers)"
        ),
        interval_s=0.05,
    )
    return ended


async def test_every_call_in_another_thread_ends_when_the_client_closes(
    start_replica: StartReplica, settings: Settings
) -> None:
    await start_replica()
    for trial in range(TRIALS):
        ended = await asyncio.to_thread(close_under_calls, settings, trial % 10)
        assert len(ended) == THREADS
        assert all(error.startswith(UnavailableError.__name__) for error in ended), ended
