"""Requests a deleted deployment leaves behind: once its last replica is gone, nothing will ever run what its request
streams still hold (queued, or held by a replica that stopped before finishing it). Their callers are told so, with a
NotFoundError, before the streams are deleted: otherwise each would wait out its whole deadline for an answer that
cannot come."""

from __future__ import annotations

import logging
from typing import cast

import redis.asyncio as aioredis

from streamserve.transport.streams import reply_command
from streamserve.wire.errors import ProtocolError
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Reply, ReplyStatus, Request

logger = logging.getLogger(__name__)

# Entries read, and replies sent, per round trip.
PAGE = 500


async def answer_left_requests(redis: aioredis.Redis, keys: Keys, deployment: str) -> int:
    """Tell the caller of every request left in ``deployment``'s request streams (its priority levels' and the
    routed ones of a multiplexing deployment) that the deployment is gone; how many were told."""
    streams = list(keys.request_streams(deployment).values())
    async for key in redis.scan_iter(match=keys.routed_requests(deployment, "*"), count=PAGE):
        streams.append(key.decode() if isinstance(key, bytes) else key)
    told = 0
    for stream in streams:
        told += await _answer_stream(redis, stream, deployment)
    return told


async def _answer_stream(redis: aioredis.Redis, stream: str, deployment: str) -> int:
    told = 0
    start = "-"
    while True:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(stream, start, "+", count=PAGE))
        if not entries:
            return told
        async with redis.pipeline(transaction=False) as pipe:
            for _, fields in entries:
                try:
                    request = Request.decode(fields)
                except ProtocolError:  # a malformed entry: nobody to tell
                    continue
                if not request.reply_to:  # sent without waiting for a reply (``send``)
                    continue
                reply = Reply(
                    request.request_id,
                    ReplyStatus.GONE,
                    "",
                    error_type="NotFoundError",
                    error_message=(
                        f"deployment {deployment!r} was deleted before request {request.request_id} ran to its end"
                    ),
                    tag=request.tag,
                )
                pipe.execute_command(*reply_command(request.reply_to, reply))
                told += 1
            await pipe.execute(raise_on_error=False)
        if len(entries) < PAGE:
            return told
        start = "(" + entries[-1][0].decode()
