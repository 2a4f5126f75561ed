"""Finishing requests: the replies of one loop turn, then one XACK and one XDEL for all their entries.

An entry is acknowledged and deleted only after its reply, in the same
pipelined round trip (Redis runs a pipeline's commands in order), so a
replica that dies in between leaves it pending, to be claimed again:
at-least-once, never lost. Acknowledged entries are deleted at once so that
the request stream holds only what is queued or being worked on.

A round trip that fails because Redis is away is sent again, the same
commands, until Redis answers: left pending, the entries would stay with this
live replica for as long as it runs, and be run a second time once it is gone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS
from streamserve.transport.pipelining import Command, Pipeliner
from streamserve.transport.streams import reply_command
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Reply

logger = logging.getLogger(__name__)

# A finishing round trip that failed for want of Redis is retried at most this far apart.
RETRY_CAP_S = 1.0


class Finisher:
    """Collects the requests finished during one loop turn and finishes them in one round trip."""

    def __init__(self, pipeliner: Pipeliner, stream: str, on_finished: Callable[[list[bytes]], None], who: str) -> None:
        self._pipeliner = pipeliner
        self._stream = stream
        # Called with the entries a round trip settled, whether it succeeded or not.
        self._on_finished = on_finished
        self._who = who
        self._replies: list[Command] = []
        self._entry_ids: list[bytes] = []
        self._backoff = Backoff(cap=RETRY_CAP_S)

    def finish(self, entry_id: bytes, reply: Reply | None = None, reply_to: str = "") -> None:
        """Reply (unless ``reply`` is None: nobody waits for it) and acknowledge ``entry_id`` this turn."""
        if reply is not None:
            self._replies.append(reply_command(reply_to, reply))
        if not self._entry_ids:
            asyncio.get_running_loop().call_soon(self._flush)  # after the rest of this turn's requests
        self._entry_ids.append(entry_id)

    def _flush(self) -> None:
        replies, entry_ids = self._replies, self._entry_ids
        self._replies, self._entry_ids = [], []
        commands: list[Command] = [
            *replies,
            ("XACK", self._stream, CONSUMER_GROUP, *entry_ids),
            ("XDEL", self._stream, *entry_ids),
        ]
        self._send(commands, entry_ids)

    def _send(self, commands: list[Command], entry_ids: list[bytes]) -> None:
        sent = self._pipeliner.execute(*commands)
        sent.add_done_callback(functools.partial(self._sent, commands, entry_ids))

    def _sent(self, commands: list[Command], entry_ids: list[bytes], sent: asyncio.Future[list[Any]]) -> None:
        settled = True
        try:
            if sent.cancelled():
                return
            if (exc := sent.exception()) is not None:
                if isinstance(exc, RETRYABLE_ERRORS):
                    delay = self._backoff.next()
                    logger.warning(
                        "replica %s: could not finish %d request(s): %s; retrying in %.1fs",
                        self._who,
                        len(entry_ids),
                        exc,
                        delay,
                    )
                    asyncio.get_running_loop().call_later(delay, self._send, commands, entry_ids)
                    settled = False
                    return
                logger.error("replica %s: could not finish %d request(s): %s", self._who, len(entry_ids), exc)
                return
            self._backoff.reset()
            for failed in (r for r in sent.result() if isinstance(r, Exception)):
                logger.warning("replica %s: finishing requests: %s", self._who, failed)
        finally:
            if settled:
                self._on_finished(entry_ids)
