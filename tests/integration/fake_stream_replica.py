"""A replica of a streaming deployment played by the test, on the wire (issue 28's spec), step by step.

It reads the deployment's request stream as a member of the consumer group, writes chunks (a ChunkBatch of one
part) and END / error replies to each request's reply stream when the test says so, each carrying the request's tag
as a replica echoes it, and reads the ReadProgress messages callers add to its control
stream (which it makes, as a real replica does). ``run_window`` plays a generator that obeys flow control.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from streamserve.runtime.settings import Settings
from streamserve.transport.streams import ensure_group, reply_command
from streamserve.wire.ids import ReplicaID
from streamserve.wire.json_values import dumps
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import ChunkBatch, ChunkPart, ReadProgress, Reply, ReplyStatus, Request, text
from tests.harness.waiting import wait_for_async


@dataclass
class FakeStreamReplica:
    """One fake replica of ``deployment`` (make it with ``start``)."""

    redis: aioredis.Redis
    settings: Settings
    deployment: str
    window: int = 64
    replica_id: str = ""
    sent: dict[str, int] = field(default_factory=dict)  # chunks sent, by request id
    paused: bool = False  # run_window waits for its caller: the window is full

    @classmethod
    async def start(
        cls, redis: aioredis.Redis, settings: Settings, deployment: str, window: int = 64
    ) -> FakeStreamReplica:
        replica = cls(redis, settings, deployment, window, ReplicaID.new(deployment).to_str())
        await ensure_group(redis, replica.requests)
        await redis.xadd(replica.control, {"hello": b""})  # a replica makes its control stream
        return replica

    @property
    def requests(self) -> str:
        return self.settings.keys.requests(self.deployment)

    @property
    def control(self) -> str:
        return self.settings.keys.replica_control(self.deployment, self.replica_id)

    def twin(self) -> FakeStreamReplica:
        """Another replica of the same deployment (for re-runs): same group, its own id and control stream."""
        return FakeStreamReplica(
            self.redis, self.settings, self.deployment, self.window, ReplicaID.new(self.deployment).to_str()
        )

    async def make_control_stream(self) -> None:
        await self.redis.xadd(self.control, {"hello": b""})

    async def next_request(self, timeout_s: float = 10.0) -> Request:
        """The next request queued for the deployment (read as this replica, left pending)."""
        found: list[Request] = []

        async def read() -> bool:
            batches = await self.redis.xreadgroup(
                CONSUMER_GROUP, self.replica_id, {self.requests: ">"}, count=1, block=50
            )
            for _stream, entries in batches or []:
                for _entry_id, fields in entries:
                    found.append(Request.decode(fields))
            return bool(found)

        await wait_for_async(read, timeout_s, f"no request reached {self.deployment}", interval_s=0)
        return found[0]

    async def chunks(self, request: Request, values: list[Any], seq: int | None = None) -> None:
        """One message of ``values`` (from chunk ``seq``, default: after those sent)."""
        first = self.sent.get(request.request_id, 0) if seq is None else seq
        body = b"\n".join(dumps(value) for value in values)
        part = ChunkPart(request.request_id, request.tag, first, len(values), self.window, body)
        await self._reply(request, ChunkBatch(self.replica_id, [part]))
        self.sent[request.request_id] = first + len(values)

    async def send_forever(self, request: Request, value: Any, interval_s: float = 0.02, most: int = 500) -> None:
        """A generator that does not end: ``value`` every ``interval_s`` (run it as a task; cancel it), and in any
        case no more than ``most`` times (a cancel lost in a Redis command must not leave it running for ever)."""
        for _ in range(most):
            await self.chunks(request, [value])
            await asyncio.sleep(interval_s)

    async def end(self, request: Request) -> None:
        seq = self.sent.get(request.request_id, 0)
        await self._reply(request, request.reply(ReplyStatus.END, self.replica_id, seq=seq))

    async def fail(
        self,
        request: Request,
        error_type: str = "ValueError",
        message: str = "boom",
        status: ReplyStatus = ReplyStatus.USER_ERROR,
    ) -> None:
        seq = self.sent.get(request.request_id, 0)
        await self._reply(
            request,
            request.reply(status, self.replica_id, error_type=error_type, error_message=message, seq=seq),
        )

    async def answer(self, request: Request, result: Any) -> None:
        """A unary handler's answer."""
        await self._reply(request, request.reply(ReplyStatus.OK, self.replica_id, body=dumps(result)))

    async def _reply(self, request: Request, reply: Reply | ChunkBatch) -> None:
        await self.redis.execute_command(*reply_command(request.reply_to, reply))

    async def progress(self) -> list[ReadProgress]:
        """The ReadProgress messages on this replica's control stream, oldest first."""
        entries = await self.redis.xrange(self.control)
        return [ReadProgress.decode(fields) for _id, fields in entries if fields.get(b"kind") == b"read"]

    async def reads(self, request: Request) -> list[int]:
        return [p.read for p in await self.progress() if p.request_id == request.request_id]

    async def run_window(self, request: Request, total: int, value: Any = None) -> None:
        """Play a generator of ``total`` chunks (``value`` or the chunk's index) that obeys flow control: it never
        gets more than ``window`` chunks ahead of the ``read`` its caller last reported; then END."""
        read, last_id = 0, "0-0"
        while self.sent.get(request.request_id, 0) < total:
            sent = self.sent.get(request.request_id, 0)
            if sent - read < self.window:
                self.paused = False
                await self.chunks(request, [sent if value is None else value])
                continue
            self.paused = True
            batches = await self.redis.xread({self.control: last_id}, block=100)  # wait for the caller
            for _stream, entries in batches or []:
                for entry_id, fields in entries:
                    last_id = text(entry_id)
                    if fields.get(b"kind") == b"read" and fields.get(b"id") == request.request_id.encode():
                        read = max(read, int(fields[b"read"]))
        self.paused = False
        await self.end(request)
