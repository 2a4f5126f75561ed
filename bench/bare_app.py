"""The ceiling of the HTTP path: the noop in a plain FastAPI app, no queue.

It parses the JSON body (the gateway validates it too) and answers it unchanged, as
``examples.functions:noop`` does, on uvicorn with the gateway's settings (app/main.py): uvloop,
httptools, one process (or ``--workers N`` on the one port, as ``streamserve gateway --workers N``).

    .venv/bin/python -m bench.bare_app --port 8001 [--workers 2]
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

from streamserve.app.main import UVICORN_OPTIONS

app = FastAPI(title="bare noop")


@app.post("/noop")
async def noop(request: Request) -> Response:
    body: Any = orjson.loads(await request.body() or b"null")
    return Response(orjson.dumps(body), media_type="application/json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    target = app if args.workers == 1 else f"{__name__}:app"  # uvicorn's workers import the app by name
    uvicorn.run(target, host=args.host, port=args.port, workers=args.workers, **UVICORN_OPTIONS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
