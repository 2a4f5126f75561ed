"""What one stream of the stream bench yields, the same for every system compared (bench/stream_bench.py).

The streamserve deployment (bench/deployments.py), the bare FastAPI app (bench/bare_stream_app.py) and the Ray Serve
app (bench/compare/ray_stream.py, run in Ray's own virtualenv) all iterate ``chunks``; the two FastAPI ones encode
each value as one NDJSON line, as a user writes a ``StreamingResponse``, and streamserve encodes what its handler
yields itself. Imports nothing outside the standard library, so that Ray's virtualenv can import it too (which is
why the line Ray's side prints when it is ready is here as well).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

# What bench/compare/ray_stream.py prints once Ray Serve answers (in Ray's virtualenv: hence here, with no imports).
RAY_READY = "ray_stream ready:"
# The chunks of one stream, when the body does not say.
CHUNKS_PER_STREAM = 200
TOKEN = "tok"


def chunk(index: int) -> dict[str, Any]:
    """The ``index``-th chunk of a fast stream: a small JSON object, like one token of a language model."""
    return {"token": TOKEN, "index": index}


async def chunks(body: Any) -> AsyncIterator[dict[str, Any]]:
    """Body ``{"n": N}``: N chunks (``chunk(i)``), yielded as fast as the generator can.

    Body ``{"n": N, "per_s": R}``: N chunks at R a second, on a fixed schedule from the first (a late one does not
    push the others back); each is ``{"index": i, "t": <time.time() at its yield>, "due": <when it was due>}``, so
    that whoever receives it can tell how long it took from ``yield`` to there, and from when it was due (a
    generator that its process runs late yields late: the bench runs on one machine, one clock).
    """
    body = body if isinstance(body, dict) else {}
    n = int(body.get("n", CHUNKS_PER_STREAM))
    per_s = float(body.get("per_s", 0))
    if per_s <= 0:
        for index in range(n):
            yield chunk(index)
        return
    period = 1 / per_s
    start, wall_start = time.monotonic(), time.time()
    for index in range(n):
        wait = start + index * period - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        yield {"index": index, "t": time.time(), "due": wall_start + index * period}
