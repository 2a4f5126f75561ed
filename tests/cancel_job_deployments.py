"""Deployments of tests/integration/test_job_cancel.py, served by in-process replicas (on the test's event loop).

``record`` writes what each call went through to EVENTS, as ``(body's id, event)``: "start" when it begins, then
"done" when it returns, or "cancelled" when its task got asyncio.CancelledError. A body with ``"hold": true`` waits
for RELEASE before it returns; one with ``"fail": true`` raises.
"""

from __future__ import annotations

import asyncio
from typing import Any

EVENTS: list[tuple[str, str]] = []
RELEASE = asyncio.Event()  # replaced by the test's fixture: an Event belongs to one event loop


def events_of(call_id: str) -> list[str]:
    """What the call whose body has ``"id": call_id`` went through, in order."""
    return [event for seen, event in EVENTS if seen == call_id]


async def record(body: dict[str, Any]) -> Any:
    call_id = body["id"]
    EVENTS.append((call_id, "start"))
    try:
        if body.get("hold"):
            await RELEASE.wait()
    except asyncio.CancelledError:
        EVENTS.append((call_id, "cancelled"))
        raise
    if body.get("fail"):
        raise ValueError(f"failed on purpose: {call_id}")
    EVENTS.append((call_id, "done"))
    return {"id": call_id}
