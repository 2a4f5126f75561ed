"""Ending the run of an idempotency key (wire/idempotency.py): the SETTLE_RUN command, and the answers to its waiters.

A replica settles a run in the same round trip as its reply and acknowledgement
(workers/finisher.py); a caller that cancels a queued run, and the reclaimer
that dead-letters one, release its key here. Either way the callers that
joined the run get a copy of its reply, or RETRY when the key was released.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis.asyncio as aioredis

from streamserve.transport.pipelining import Command
from streamserve.transport.streams import reply_command
from streamserve.wire import idempotency, scripts
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Reply, ReplyStatus

# Sent as EVAL with its source: rare next to plain replies, and a NOSCRIPT (Redis restarted) cannot fail it.
_SETTLE_RUN = scripts.SETTLE_RUN


@dataclasses.dataclass(slots=True)
class Settlement:
    """How one run ends: its SETTLE_RUN command, and what the callers waiting for it get."""

    command: Command
    # What the run's waiters get (each with its own request id and tag): the reply stored, or RETRY when released.
    reply: Reply

    def answers(self, result: Any) -> list[Command]:
        """The replies to the waiters that SETTLE_RUN returned (``result``)."""
        if not isinstance(result, list):
            return []
        return [
            reply_command(reply_to, dataclasses.replace(self.reply, request_id=request_id, tag=tag))
            for reply_to, tag, request_id in idempotency.waiters(result)
        ]


def settle(keys: Keys, deployment: str, idem: str, run: str, reply: Reply, ttl_s: float) -> Settlement:
    """The settlement of the run ``run`` of key ``idem``, which ended with ``reply``."""
    outcome, fields = idempotency.settlement(reply)
    record, waiting = keys.idempotency(deployment, idem), keys.idempotency_waiters(deployment, idem)
    command = ("EVAL", _SETTLE_RUN, 2, record, waiting, run, outcome, int(ttl_s * 1000), *fields)
    if outcome == idempotency.RELEASE:
        reply = Reply(reply.request_id, ReplyStatus.RETRY, reply.replica_id)
    return Settlement(command, reply)


async def release(redis: aioredis.Redis, keys: Keys, deployment: str, idem: str, run: str) -> None:
    """Free key ``idem`` whose run ``run`` never ran (cancelled while queued, dead-lettered), and tell its waiters to
    send their calls again."""
    settlement = settle(keys, deployment, idem, run, Reply("", ReplyStatus.RETRY, ""), 0)
    result = await redis.execute_command(*settlement.command)  # type: ignore[no-untyped-call]
    for command in settlement.answers(result):
        await redis.execute_command(*command)  # type: ignore[no-untyped-call]
