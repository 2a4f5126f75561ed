"""The ceiling of the client path: a minimal request/reply round trip on Redis streams with redis-py.

The caller XADDs ``{id, reply, body}`` to one request stream; the worker reads it with XREADGROUP,
decodes and re-encodes the JSON body (the noop), XADDs ``{id, body}`` to the caller's reply stream,
and XACKs + XDELs the request, all of one read in one pipeline; the caller's one reader task XREADs
its reply stream and resolves the waiting future. No admission check, no deadlines, no heartbeats,
no routing: what any streams-based RPC must do at least. With ``pipelined`` the caller also batches
the XADDs of every request issued while the previous batch was on the wire into one pipeline.

    python -m bench.compare.raw_streams --redis-url redis://127.0.0.1:PORT/0 [--batch 32]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

REQUESTS = "bench-raw:requests"
GROUP = "workers"
READ_BLOCK_MS = 1000
POOL_SIZE = 64  # the connection pool of streamserve's asyncio client (streamserve.transport.connections.POOL_SIZE)


def serve(url: str, batch: int) -> None:
    """The worker: read up to ``batch`` requests at a time, answer them all in one pipeline. Runs until killed."""
    client = redis.Redis.from_url(url)
    try:
        client.xgroup_create(REQUESTS, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    print("raw streams worker ready", flush=True)
    consumer = f"worker-{os.getpid()}"
    while True:
        got: Any = client.xreadgroup(GROUP, consumer, {REQUESTS: ">"}, count=batch, block=READ_BLOCK_MS)
        if not got:
            continue
        pipe = client.pipeline(transaction=False)
        ids = []
        for _stream, entries in got:
            for entry_id, fields in entries:
                body = orjson.dumps(orjson.loads(fields[b"body"]))
                pipe.xadd(fields[b"reply"], {b"id": fields[b"id"], b"body": body})
                ids.append(entry_id)
        pipe.xack(REQUESTS, GROUP, *ids)
        pipe.xdel(REQUESTS, *ids)
        pipe.execute()


class RawClient:
    """The caller: one reply stream, one reader task, a future per request in flight."""

    def __init__(self, url: str, pipelined: bool) -> None:
        # Like streamserve's client: at most POOL_SIZE connections, and a command waits for a free one.
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=20)
        self.redis = aioredis.Redis.from_pool(pool)
        self.pipelined = pipelined
        self.reply = f"bench-raw:replies:{os.getpid()}"
        self._ids = itertools.count()
        self._pending: dict[bytes, asyncio.Future[bytes]] = {}
        self._outbox: list[dict[bytes, bytes]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._last = b"0-0"

    async def start(self) -> None:
        entry_id = await self.redis.xadd(self.reply, {b"hello": b""})
        self._last = entry_id if isinstance(entry_id, bytes) else entry_id.encode()
        self._reader = asyncio.create_task(self._read())

    async def aclose(self) -> None:
        for task in (self._reader, self._flusher):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._reader, self._flusher) if t), return_exceptions=True)
        await self.redis.delete(self.reply)
        await self.redis.aclose()

    async def call(self, body: Any) -> Any:
        request_id = str(next(self._ids)).encode()
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        fields = {b"id": request_id, b"reply": self.reply.encode(), b"body": orjson.dumps(body)}
        try:
            if self.pipelined:
                self._outbox.append(fields)
                if self._flusher is None or self._flusher.done():
                    self._flusher = asyncio.create_task(self._flush())
            else:
                await self.redis.xadd(REQUESTS, fields)  # type: ignore[arg-type]
            return orjson.loads(await asyncio.wait_for(fut, 30))
        finally:
            self._pending.pop(request_id, None)

    async def _flush(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, []
            async with self.redis.pipeline(transaction=False) as pipe:
                for fields in batch:
                    pipe.xadd(REQUESTS, fields)  # type: ignore[arg-type]
                await pipe.execute()

    async def _read(self) -> None:
        while True:
            got: Any = await self.redis.xread({self.reply: self._last}, count=1000, block=READ_BLOCK_MS)
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    self._last = entry_id
                    fut = self._pending.get(fields.get(b"id", b""))
                    if fut is not None and not fut.done():
                        fut.set_result(fields[b"body"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the raw Redis streams worker")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--batch", type=int, default=32, help="most requests read (and answered) at once")
    args = parser.parse_args(argv)
    serve(args.redis_url, args.batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
