"""The ceiling of the stream bench: the same chunks from a plain FastAPI ``StreamingResponse``, no queue.

``POST /stream`` with the body streamserve's deployment gets (bench/stream_chunks.py) answers NDJSON: each chunk
encoded as one line, as a user writes a ``StreamingResponse``. On uvicorn with the gateway's settings (app/main.py):
uvloop, httptools, one process, no access log.

    .venv/bin/python -m bench.bare_stream_app --port 8001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from bench.stream_chunks import chunks
from streamserve.app.main import UVICORN_OPTIONS

app = FastAPI(title="bare stream")


async def ndjson(values: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for value in values:
        yield orjson.dumps(value) + b"\n"


@app.post("/stream")
async def stream(request: Request) -> StreamingResponse:
    body: Any = orjson.loads(await request.body() or b"null")
    return StreamingResponse(ndjson(chunks(body)), media_type="application/x-ndjson")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, **UVICORN_OPTIONS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
