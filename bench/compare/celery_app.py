"""Celery doing the noop, with a Redis broker and result backend; also the FastAPI + Celery HTTP pattern.

    python -m bench.compare.celery_app worker --redis-url URL [--concurrency 32]
    python -m bench.compare.celery_app http --redis-url URL --port PORT

The worker is one process with a thread pool of ``--concurrency`` threads, like a streamserve replica
(one process, up to ``max_ongoing_requests`` handlers at once). The HTTP app is the common pattern: an
endpoint that parses the JSON body, calls ``noop.delay(body)`` and awaits ``.get()`` in Starlette's
thread pool (``get()`` blocks), on uvicorn with the streamserve gateway's settings.
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from celery import Celery
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

NOOP_TASK = "bench.noop"


def noop(body: Any) -> Any:
    """Returns its input unchanged."""
    return body


def make_app(redis_url: str) -> Celery:
    app = Celery("bench", broker=redis_url, backend=redis_url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=600,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    app.task(name=NOOP_TASK)(noop)
    return app


def run_worker(redis_url: str, concurrency: int) -> None:
    argv = ["worker", "--pool=threads", f"--concurrency={concurrency}", "--loglevel=WARNING"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--hostname=bench@localhost"]
    make_app(redis_url).worker_main(argv)


def run_http(redis_url: str, port: int) -> None:
    import uvicorn

    from streamserve.app.main import UVICORN_OPTIONS

    celery = make_app(redis_url)
    task = celery.tasks[NOOP_TASK]
    api = FastAPI(title="FastAPI + Celery noop")

    def call(body: Any) -> Any:
        return task.delay(body).get(timeout=30)

    @api.post("/noop")
    async def endpoint(request: Request) -> Response:
        body: Any = orjson.loads(await request.body() or b"null")
        return Response(orjson.dumps(await run_in_threadpool(call, body)), media_type="application/json")

    uvicorn.run(api, host="127.0.0.1", port=port, workers=1, **UVICORN_OPTIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Celery noop: worker or FastAPI app")
    parser.add_argument("role", choices=["worker", "http"])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    if args.role == "worker":
        run_worker(args.redis_url, args.concurrency)
    else:
        if args.port is None:
            parser.error("http needs --port")
        run_http(args.redis_url, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
