"""A streaming deployment: yields the words of a text one at a time, like a language model making tokens.

An async generator: each ``yield`` is one chunk, sent to the caller as it is made (NDJSON or Server-Sent Events over
HTTP, ``Client.stream()`` in Python).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

DEFAULT_TEXT = "Streams arrive one token at a time, as the model makes them."


async def generate(body: Any) -> AsyncIterator[dict[str, Any]]:
    """Body: ``{"text": str, "delay_s": float}`` (both optional). Chunks: ``{"token": word, "index": i}``."""
    body = body if isinstance(body, dict) else {}
    delay_s = float(body.get("delay_s", 0.05))
    for index, token in enumerate(str(body.get("text", DEFAULT_TEXT)).split()):
        if index:
            await asyncio.sleep(delay_s)
        yield {"token": token, "index": index}
