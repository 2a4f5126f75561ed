"""Ray Serve answering the stream bench's streams: a FastAPI ingress returning a ``StreamingResponse`` of the chunks.

Runs in a virtualenv of its own, never streamserve's (``ray[serve]`` would move fastapi, starlette and pydantic under
it; bench/README.md, "Ray Serve"), from the repository root so that it imports bench/stream_chunks.py, the chunks
every system yields:

    /work/raybench/.venv/bin/python -m bench.compare.ray_stream --port PORT [--replicas 2] [--max-ongoing 1000]

It starts a local Ray (no dashboard, no usage stats), Serve's HTTP proxy on 127.0.0.1:PORT (Serve's default
proxy: one process, like one streamserve gateway) and ``--replicas`` replicas, each taking up to ``--max-ongoing``
requests at once as streamserve's replicas do (Serve's default, 5, would queue most of 100 streams in the proxy).
Prints RAY_READY (Ray's own log lines say "ready" too) once the application runs, then serves until SIGTERM or SIGINT,
sent to its whole process group: Ray's processes stop with it.
"""

# No ``from __future__ import annotations``: Serve pickles the ingress class by value, and FastAPI could then not
# resolve the endpoint's annotations (``request: Request`` would become a query parameter).
import argparse
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import orjson
import ray
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from ray import serve

from bench.stream_chunks import RAY_READY, chunks

# Ray's object store: the smallest it takes is enough (the chunks go by Ray's streaming generator protocol).
OBJECT_STORE_BYTES = 100 * 1024 * 1024

api = FastAPI(title="Ray Serve stream")


async def ndjson(values: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for value in values:
        yield orjson.dumps(value) + b"\n"


@serve.deployment
@serve.ingress(api)
class Streams:
    @api.post("/stream")
    async def stream(self, request: Request) -> StreamingResponse:
        body: Any = orjson.loads(await request.body() or b"null")
        return StreamingResponse(ndjson(chunks(body)), media_type="application/x-ndjson")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ray Serve: the stream bench's streams")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-ongoing", type=int, default=1000)
    args = parser.parse_args(argv)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # read when Ray starts: nothing leaves the machine
    ray.init(
        _node_ip_address="127.0.0.1",  # Ray's own processes talk over the loopback too
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        log_to_driver=False,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs handlers of its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        # num_cpus 0: Ray reserves no core per replica, so that any --replicas fits on a 2-core machine.
        deployment = Streams.options(
            num_replicas=args.replicas,
            max_ongoing_requests=args.max_ongoing,
            ray_actor_options={"num_cpus": 0},
        )
        serve.run(deployment.bind(), route_prefix="/")
        print(f"{RAY_READY} Ray Serve {ray.__version__} on 127.0.0.1:{args.port}", flush=True)
        while not stop.wait(1):
            pass
    except BaseException:
        ray.shutdown()
        raise
    # Stopped by a signal, which went to the whole process group (the bench's Child, or a terminal's Ctrl-C): Ray's
    # own processes are stopping already, and ray.shutdown() (also Ray's atexit hook) would wait ~10 s for them.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
