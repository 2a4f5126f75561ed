"""An I/O-bound async deployment: sleeps ``seconds`` (from the body, or its default) and answers."""

from __future__ import annotations

import asyncio
from typing import Any


class Sleepy:
    def __init__(self, seconds: float = 0.1) -> None:
        self.seconds = seconds

    async def __call__(self, body: Any) -> dict[str, Any]:
        seconds = body.get("seconds", self.seconds) if isinstance(body, dict) else self.seconds
        await asyncio.sleep(float(seconds))
        return {"slept": seconds}
