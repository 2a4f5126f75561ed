"""Deployments used by the tests (imported by replicas as ``tests.deployments:...``)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

CALLS: list[Any] = []
"""Bodies seen by Recorder in this process (for in-process replicas)."""


class Recorder:
    """Records every body it runs; ``boom`` raises a user error."""

    def __init__(self, tag: str = "rec") -> None:
        self.tag = tag
        self.config: Any = None

    def reconfigure(self, user_config: Any) -> None:
        self.config = user_config

    def __call__(self, body: Any) -> dict[str, Any]:
        CALLS.append(body)
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
