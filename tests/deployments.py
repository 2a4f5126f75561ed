"""Deployments used by the tests (imported by replicas as ``tests.deployments:...``)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from typing import Any

CALLS: list[Any] = []
"""Bodies seen by Recorder in this process (for in-process replicas)."""
CALLS_BY_TAG: Counter[str] = Counter()
"""How many calls each Recorder tag ran in this process."""


class Recorder:
    """Records every body it runs; ``boom`` raises a user error."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.config: Any = None

    def reconfigure(self, user_config: Any) -> None:
        self.config = user_config

    def __call__(self, body: Any) -> dict[str, Any]:
        CALLS.append(body)
        CALLS_BY_TAG[self.tag] += 1
        return {"tag": self.tag, "body": body, "config": self.config}

    def boom(self, body: Any) -> None:
        raise ValueError(f"boom: {body}")


class Rendezvous:
    """Sync handler that only returns once ``parties`` calls run at the same time (else it times out)."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=10)

    def __call__(self, body: Any) -> int:
        return self.barrier.wait()


GATE = asyncio.Event()
"""Opened by a test (in the same process as an in-process replica) to let Gate handlers return."""


async def gate(body: Any) -> Any:
    """Async handler that returns its body once the test opens GATE."""
    await GATE.wait()
    return body


class FailingConstructor:
    def __init__(self) -> None:
        raise RuntimeError("weights not found")


def pid(body: Any) -> int:
    """Returns the replica's pid."""
    return os.getpid()


def crash_on(body: Any) -> Any:
    """Kills its own process (as a segfaulting model would) when asked to; echoes anything else."""
    if body == "crash":
        os._exit(3)
    return body


class Tally:
    """Appends one line per call to ``path``, so a test can count calls made in replica processes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, body: Any) -> None:
        with open(self.path, "a") as tally:
            tally.write("call\n")
