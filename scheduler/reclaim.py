"""Recovering work from dead replicas: their pending entries go back to the queue or to the dead-letter stream."""

from __future__ import annotations

import logging
from collections.abc import Set
from dataclasses import dataclass
from typing import cast

import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from streamserve.transport import settling
from streamserve.transport.connections import RETRYABLE_ERRORS
from streamserve.transport.streams import DEAD_LETTER_FIELDS, DeadLetter, Requeuer, dead_letters, send_reply
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import Reply, ReplyStatus, text
from streamserve.wire.models import routed_lane
from streamserve.wire.priorities import PRIORITIES, priority_lane

logger = logging.getLogger(__name__)

MOVE_BATCH = 100


@dataclass
class ReclaimResult:
    requeued: int = 0
    dead_lettered: int = 0
    consumers_removed: int = 0


class Reclaimer:
    """Finds consumers of a deployment's group that no live replica answers for, and frees what they held.

    Entries are re-queued (a new entry with ``attempts`` + 1) rather than
    claimed onto a live consumer: replicas then take them through their one
    read path, within ``max_ongoing_requests``, and the attempt count needs no
    Redis 7 delivery counters.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._requeuer = Requeuer(redis, keys)

    async def reclaim(self, cfg: DeploymentConfig, live: Set[str], retired: Set[str] = frozenset()) -> ReclaimResult:
        """Free everything held by consumers not in ``live`` (replica ids still running or draining), in each of the
        deployment's request streams (one per priority level, and each replica's routed one: wire/models.py).
        ``retired``: replicas the scheduler stopped (a rollout, a scale-down) whose drain ended with requests still
        running (at their own drain limit, or killed at the deadline): none of those caused their end, so each is
        queued again as it was, not charged an attempt (nor run alone, nor dead-lettered for it)."""
        result = ReclaimResult()
        await self.tell_dead_letters(cfg)  # left untold by a scheduler that was killed, or by a lost answer
        lanes = [priority_lane(priority) for priority in PRIORITIES]
        routed = await self._redis.zrange(self._keys.routed_replicas(cfg.name), 0, -1)
        lanes += [routed_lane(text(cast(bytes, replica))) for replica in routed]
        for lane in lanes:
            stream = self._keys.lane_stream(cfg.name, lane)
            try:
                consumers = await self._redis.xinfo_consumers(stream, CONSUMER_GROUP)
            except ResponseError:  # no stream or no group yet
                continue
            for consumer in consumers:
                name = text(consumer["name"])
                if name in live:
                    continue
                if int(consumer["pending"]) > 0:
                    await self._free(cfg, lane, name, result, charge=name not in retired)
                await self._redis.xgroup_delconsumer(stream, CONSUMER_GROUP, name)
                result.consumers_removed += 1
        return result

    async def _free(
        self, cfg: DeploymentConfig, lane: bytes, consumer: str, result: ReclaimResult, *, charge: bool
    ) -> None:
        reason = f"its replica died while running it (the last one: {consumer})"
        stream = self._keys.lane_stream(cfg.name, lane)
        while True:
            pending = await self._redis.xpending_range(stream, CONSUMER_GROUP, "-", "+", MOVE_BATCH, consumer)
            if not pending:
                return
            ids = [p["message_id"] for p in pending]
            dead = await self._requeuer.requeue(
                cfg.name,
                ids,
                charge=charge,
                max_delivery_attempts=cfg.max_delivery_attempts,
                reason=reason,
                lane=lane,
                holder_gone=True,
            )
            result.dead_lettered += len(dead)
            result.requeued += len(ids) - len(dead)
            await self.tell_dead_letters(cfg)
            logger.warning(
                "deployment %s: freed %d request(s) of %s (%d to the dead-letter stream)",
                cfg.name,
                len(ids),
                f"dead replica {consumer}" if charge else f"replica {consumer}, stopped at its drain deadline",
                len(dead),
            )

    async def tell_dead_letters(self, cfg: DeploymentConfig) -> None:
        """Tell the callers of the requests sent to the dead-letter stream, and free their runs, as the REQUEUE
        script listed them (Keys.untold_dead_letters); each is dropped from that list once done, so that one is told
        at least once whatever fails in between (told twice, a caller ignores the second)."""
        untold = self._keys.untold_dead_letters(cfg.name)
        while fields := await self._redis.lrange(untold, 0, MOVE_BATCH * DEAD_LETTER_FIELDS - 1):
            done = 0
            for letter in dead_letters(fields):
                try:
                    await self._tell_caller(cfg, letter)
                    if letter.run:  # it never ran to its end: a retry with its key (or an identical request) runs
                        await settling.release(self._redis, self._keys, cfg.name, letter)
                except RETRYABLE_ERRORS as exc:  # told at the next pass; freeing dead replicas' work goes on
                    logger.warning("deployment %s: could not tell a dead letter's caller yet: %s", cfg.name, exc)
                    break
                except redis.RedisError as exc:  # (a reply stream that is no stream, say: nothing would mend it)
                    logger.warning(
                        "deployment %s: could not tell request %s's caller: %s", cfg.name, letter.request_id, exc
                    )
                done += 1
            if done:
                await self._redis.ltrim(untold, done * DEAD_LETTER_FIELDS, -1)
            if done * DEAD_LETTER_FIELDS < len(fields):
                return

    async def _tell_caller(self, cfg: DeploymentConfig, letter: DeadLetter) -> None:
        if not letter.reply_to:
            return
        message = (
            f"request {letter.request_id} was delivered {_times(letter.deliveries)} {letter.reason}; "
            f"it was moved to {self._keys.dead_letters(cfg.name)}"
        )
        reply = Reply(
            letter.request_id,
            ReplyStatus.DEAD_LETTER,
            "",
            error_type="DeadLetterError",
            error_message=message,
            tag=letter.tag,
        )
        await send_reply(self._redis, letter.reply_to, reply)


def _times(deliveries: int) -> str:
    """How often a dead letter was delivered, as its message says it: "once and" or "3 times and each time"."""
    return "once and" if deliveries == 1 else f"{deliveries} times and each time"
