"""Operations on the farm's streams that more than one role performs: the consumer group, replies, re-queueing.

Request streams are bounded by admission and by deleting acknowledged
entries (never by MAXLEN, which would drop work still pending); reply streams
are capped approximately here, since their reader drains them continuously;
dead-letter streams are capped approximately by the REQUEUE script.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.typing import EncodableT

from streamserve.transport.pipelining import Command
from streamserve.wire import scripts
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import CancelRequest, ChunkBatch, ReadProgress, Reply, text
from streamserve.wire.models import replica_of_lane
from streamserve.wire.priorities import lane_ref
from streamserve.wire.tenants import DEFAULT_TENANT

# Approximate cap on a caller's reply stream; its reader drains and trims it continuously.
REPLY_STREAM_MAXLEN = 100_000
# Approximate bound of each dead-letter stream; the REQUEUE script enforces it.
DEAD_LETTER_CAP = 10_000
# Lines a deployment's log stream keeps (Keys.logs; XADD MAXLEN ~), over all its replicas.
LOG_STREAM_LINES = 10_000
# Approximate cap on a replica's control stream (Keys.replica_control): the replica reads it continuously, and both
# it and the callers that add to it cap it.
CONTROL_STREAM_MAXLEN = 10_000


def reply_command(reply_to: str, reply: Reply | ChunkBatch) -> Command:
    """The XADD of a reply (or of chunks) to its caller's stream: never creates a stream whose reader is gone
    (NOMKSTREAM)."""
    fields = itertools.chain.from_iterable(reply.encode().items())
    return ("XADD", reply_to, "NOMKSTREAM", "MAXLEN", "~", REPLY_STREAM_MAXLEN, "*", *fields)


def control_command(control_stream: str, message: CancelRequest | ReadProgress) -> Command:
    """The XADD of a message to a replica's control stream: never makes the stream of a replica that is gone."""
    fields = itertools.chain.from_iterable(message.encode().items())
    return ("XADD", control_stream, "NOMKSTREAM", "MAXLEN", "~", CONTROL_STREAM_MAXLEN, "*", *fields)


async def send_reply(redis: aioredis.Redis, reply_to: str, reply: Reply) -> None:
    """Send one reply outside the replica's pipelined hot path (the scheduler's dead-letter notices)."""
    await redis.execute_command(*reply_command(reply_to, reply))  # type: ignore[no-untyped-call]


async def ensure_group(redis: aioredis.Redis, stream: str) -> None:
    """Create the consumer group at id 0 (and the stream), so requests queued before any replica are served."""
    try:
        await redis.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def ensure_groups(redis: aioredis.Redis, keys: Keys, deployment: str) -> None:
    """ensure_group on each of ``deployment``'s request streams (one per priority level)."""
    for stream in keys.request_streams(deployment).values():
        await ensure_group(redis, stream)


@dataclass(frozen=True)
class DeadLetter:
    """A request that went to the dead-letter stream, and whom to tell."""

    request_id: str
    reply_to: str
    deliveries: int
    tag: str = ""  # the request's (Request.tag)
    idem: str = ""  # its idempotency key (Request.idem), its cache digest (Request.cache), its run (Request.run)
    cache: str = ""
    run: str = ""
    tenant: str = DEFAULT_TENANT  # whom it was for (Request.tenant)
    reason: str = ""  # why it was dead-lettered (the callers are told)


# Fields per dead letter in REQUEUE's answer and in a deployment's untold dead letters (DeadLetter's, in order).
DEAD_LETTER_FIELDS = 9


class Requeuer:
    """Gives pending entries of a request stream back to the queue, as new entries at its tail (scripts.REQUEUE)."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._script = redis.register_script(scripts.REQUEUE)
        self._keys = keys

    async def requeue(
        self,
        deployment: str,
        entry_ids: Sequence[EncodableT],
        *,
        charge: bool,
        max_delivery_attempts: int,
        reason: str = "",
        lane: bytes = b"",
        holder_gone: bool = False,
    ) -> list[DeadLetter]:
        """Move ``entry_ids`` (pending in the group of ``deployment``'s stream of ``lane``: wire/priorities.py) back
        to that queue, atomically one by one; those cancelled while held are dropped instead (Keys.cancelled). A
        replica's routed stream gives those its dead replica held to the deployment's stream instead, where any
        replica takes them.

        ``charge``: the replica died holding them, so each counts one more delivery attempt and goes to the
        dead-letter stream (with ``reason``) once it reaches ``max_delivery_attempts``. Without it they
        were handed back unrun and nothing is counted. ``holder_gone``: the replica that held them is gone (died, or
        was killed at its drain deadline): a routed stream's go to the deployment's. Returns the entries that were
        dead-lettered.
        """
        if not entry_ids:
            return []
        dead = await self._script(
            keys=[
                self._keys.lane_stream(deployment, lane),
                self._keys.dead_letters(deployment),
                self._keys.cancelled(deployment),
                self._keys.untold_dead_letters(deployment),
                *([self._keys.requests(deployment)] if holder_gone and replica_of_lane(lane) is not None else []),
            ],
            args=[
                CONSUMER_GROUP,
                max_delivery_attempts,
                reason,
                DEAD_LETTER_CAP,
                int(charge),
                lane_ref(lane, b""),
                self._keys.tenant_held(deployment, ""),
                *entry_ids,
            ],
        )
        return dead_letters(dead)


def dead_letters(fields: Sequence[bytes | str]) -> list[DeadLetter]:
    """The dead letters of REQUEUE's answer, or of a deployment's untold dead letters (Keys.untold_dead_letters):
    nine fields each."""
    values = [text(value) for value in fields]
    return [
        DeadLetter(request_id, reply_to, int(deliveries), tag, idem, cache, run, tenant or DEFAULT_TENANT, reason)
        for request_id, reply_to, deliveries, tag, idem, cache, run, tenant, reason in zip(
            *[iter(values)] * DEAD_LETTER_FIELDS, strict=True
        )
    ]
