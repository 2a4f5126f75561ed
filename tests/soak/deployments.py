"""What the soak (tests/soak/soak.py) deploys: handlers that record every execution, so duplicates can be counted.

Each execution appends the request's id and the time (s since the epoch) to ``<ledger>/<pid>.txt`` (the ledger
directory comes in the body): one line per run, written with O_APPEND in one write, so lines of concurrent runs
never mix. The soak reads the files afterwards, with the farm stopped, without Redis.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any


def _record(body: dict[str, Any]) -> dict[str, Any]:
    fd = os.open(os.path.join(body["ledger"], f"{os.getpid()}.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{body['id']} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)
    return {"id": body["id"]}


def record(body: dict[str, Any]) -> dict[str, Any]:
    """Records the run and answers ``{"id": ...}`` at once."""
    return _record(body)


async def record_slowly(body: dict[str, Any]) -> dict[str, Any]:
    """Sleeps ``body["sleep"]`` seconds, then records the run (a slow model)."""
    await asyncio.sleep(float(body.get("sleep", 1.0)))
    return _record(body)
