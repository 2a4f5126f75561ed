"""Finishing requests: the replies of one loop turn, then one XACK and one XDEL for all their entries.

An entry is acknowledged and deleted only after its reply, in the same
pipelined round trip (Redis runs a pipeline's commands in order), so a
replica that dies in between leaves it pending, to be claimed again:
at-least-once, never lost. Acknowledged entries are deleted at once so that
the request stream holds only what is queued or being worked on.

A round trip that fails because Redis is away is sent again, the same
commands, until Redis answers: left pending, the entries would stay with this
live replica for as long as it runs, and be run a second time once it is gone.

A reply that Redis refuses for lack of memory (maxmemory reached) fails alone:
its acknowledgement went through all the same (XACK and XDEL need no memory),
so the replica keeps the reply, and the request its slot, and sends it again
by itself until Redis takes it or the caller's deadline has passed. A large
reply is not sent again: each try would fill Redis anew, and while its bytes
arrive every other write is refused, other replicas' heartbeats and replies
included. Its caller gets a small error reply instead, saying why.

A request with an idempotency key settles its key's run (transport/settling.py)
in the same round trip, ahead of its reply and acknowledgement; the callers
that joined the run are answered in a round trip of their own once the
settlement says who they are. Should that one be lost, they find the stored
reply themselves (client/shared_calls.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import OUT_OF_MEMORY, RETRYABLE_ERRORS, refuses_writes, why_writes_refused
from streamserve.transport.pipelining import Command, Pipeliner
from streamserve.transport.settling import Settlement
from streamserve.transport.streams import reply_command
from streamserve.wire.errors import ResponseTooLargeError
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Reply, ReplyStatus, now_ms
from streamserve.wire.priorities import group_refs

logger = logging.getLogger(__name__)

# A finishing round trip that failed for want of Redis is retried at most this far apart.
RETRY_CAP_S = 1.0
# A reply Redis refused for lack of memory that is this large (body and error message) or larger is answered with
# an error reply instead; a smaller one is sent again as it is (the refusal may have lasted only a moment).
LARGE_REPLY_BYTES = 1024 * 1024

# A reply on its way: the entry it answers, the caller's reply stream, the reply, the request's deadline (epoch ms;
# 0: none).
Outgoing = tuple[bytes, str, Reply, int]


class Finisher:
    """Collects the requests finished during one loop turn and finishes them in one round trip."""

    def __init__(
        self,
        pipeliner: Pipeliner,
        streams: Callable[[bytes], str],
        on_finished: Callable[[list[bytes]], None],
        who: str,
    ) -> None:
        """``streams``: the stream of each lane (Keys.lane_stream); entries are named by their ref
        (wire/priorities.py)."""
        self._pipeliner = pipeliner
        self._streams = streams
        # Called with the entries that are settled: replied to (or given up on) and acknowledged, or left pending.
        self._on_finished = on_finished
        self._who = who
        self._outgoing: list[Outgoing] = []
        self._entry_ids: list[bytes] = []
        self._settlements: list[Settlement] = []
        # Commands the finished requests' ends release besides their entries (a tenant's held tokens: ZREM).
        self._releases: list[Command] = []
        self._backoff = Backoff(cap=RETRY_CAP_S)  # Redis away
        self._refusals = Backoff(cap=RETRY_CAP_S)  # replies refused for lack of memory (or a full disk)
        self._redo_backoff = Backoff(cap=RETRY_CAP_S)  # other commands a Redis Cluster refused
        self._refused_why = OUT_OF_MEMORY  # why Redis refused the last one refused (why_writes_refused)

    def finish(
        self,
        entry_id: bytes,
        reply: Reply | None = None,
        reply_to: str = "",
        deadline_ms: int = 0,
        settlement: Settlement | None = None,
        release: Command | None = None,
    ) -> None:
        """Reply (unless ``reply`` is None: nobody waits for it) and acknowledge ``entry_id`` this turn.

        ``deadline_ms``: the request's; a reply Redis refuses for lack of memory is not sent again past it.
        ``settlement``: how the run of the request's idempotency key ends, if it has one. ``release``: a command
        sent with the acknowledgement (the ZREM of its tenant's held token)."""
        if settlement is not None:
            self._settlements.append(settlement)
        if release is not None:
            self._releases.append(release)
        if reply is not None:
            self._outgoing.append((entry_id, reply_to, reply, deadline_ms))
        if not self._entry_ids:
            asyncio.get_running_loop().call_soon(self._flush)  # after the rest of this turn's requests
        self._entry_ids.append(entry_id)

    def _flush(self) -> None:
        outgoing, entry_ids, settlements = self._outgoing, self._entry_ids, self._settlements
        releases = self._releases
        self._outgoing, self._entry_ids, self._settlements, self._releases = [], [], [], []
        self._send(outgoing, entry_ids, True, settlements, releases)

    def _send(
        self,
        outgoing: list[Outgoing],
        entry_ids: list[bytes],
        acknowledge: bool,
        settlements: list[Settlement],
        releases: list[Command],
    ) -> None:
        """Send the settlements, the replies, and (``acknowledge``) the XACK and XDEL of ``entry_ids`` with the
        ``releases``, in one round trip."""
        commands: list[Command] = [settlement.command for settlement in settlements]
        commands += [reply_command(reply_to, reply) for _, reply_to, reply, _ in outgoing]
        if acknowledge:
            for lane, ids in group_refs(entry_ids).items():
                stream = self._streams(lane)
                commands += [("XACK", stream, CONSUMER_GROUP, *ids), ("XDEL", stream, *ids)]
            commands += releases
        sent = self._pipeliner.execute(*commands)
        sent.add_done_callback(
            functools.partial(self._sent, outgoing, entry_ids, acknowledge, settlements, releases, commands)
        )

    def _sent(
        self,
        outgoing: list[Outgoing],
        entry_ids: list[bytes],
        acknowledge: bool,
        settlements: list[Settlement],
        releases: list[Command],
        commands: list[Command],
        sent: asyncio.Future[list[Any]],
    ) -> None:
        settled = entry_ids
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
                    loop = asyncio.get_running_loop()
                    loop.call_later(delay, self._send, outgoing, entry_ids, acknowledge, settlements, releases)
                    settled = []
                    return
                logger.error("replica %s: could not finish %d request(s): %s", self._who, len(entry_ids), exc)
                return
            results = sent.result()
            if settlements:
                self._answer_waiters(settlements, results[: len(settlements)])
                results = results[len(settlements) :]
            # What a Redis Cluster refused past the round trip's own retries (CLUSTERDOWN while a master without
            # replicas is down, say) did not run, and goes again: a reply as a refused one does (below), the rest by
            # itself. Counted as done, an entry stayed pending for good, and a lost reply left its caller waiting.
            tail = commands[len(settlements) + len(outgoing) :]  # the acknowledgements and releases
            redo = [command for command, result in zip(tail, results[len(outgoing) :], strict=True) if _again(result)]
            if redo:
                self._redo_later(redo)
            self._backoff.reset()
            refused = self._refused(outgoing, results)
            if refused:
                unsettled = {entry_id for entry_id, *_ in refused}
                settled = [entry_id for entry_id in entry_ids if entry_id not in unsettled]
                self._send_again(refused)
            else:
                self._refusals.reset()
        finally:
            if settled:
                self._on_finished(settled)

    def _answer_waiters(self, settlements: list[Settlement], results: list[Any]) -> None:
        """Send the callers that joined the settled runs their copies of the replies; settle again, with the
        script's source, the runs of a Redis that did not know the script (NOSCRIPT: restarted or flushed)."""
        commands = []
        unknown = []
        for settlement, result in zip(settlements, results, strict=True):
            if isinstance(result, NoScriptError):
                unknown.append(settlement)
                continue
            if _again(result):
                unknown.append(settlement)  # (refused by a Redis Cluster: settled again, whole, as below)
                continue
            if isinstance(result, Exception):
                logger.warning("replica %s: could not settle an idempotency key: %s", self._who, result)
            commands += settlement.answers(result)
        if commands:
            self._pipeliner.execute(*commands).add_done_callback(self._answered)
        if unknown:
            self._redo_later([], unknown)

    def _redo_later(self, commands: list[Command], settlements: Sequence[Settlement] = ()) -> None:
        """Send ``commands`` (acknowledgements, releases) and ``settlements`` (whole: a Redis that did not know the
        script, or a Redis Cluster that refused them) again: the settlements at once, the rest after a pause, and
        whatever is refused again, again."""
        delay = 0.0 if not commands else self._redo_backoff.next()
        if commands:
            logger.warning(
                "replica %s: Redis refused %d command(s) finishing requests; sending them again in %.1fs",
                self._who,
                len(commands),
                delay,
            )
        asyncio.get_running_loop().call_later(delay, self._redo, commands, list(settlements))

    def _redo(self, commands: list[Command], settlements: list[Settlement]) -> None:
        sent = self._pipeliner.execute(*(settlement.with_source() for settlement in settlements), *commands)
        sent.add_done_callback(functools.partial(self._redone, commands, settlements))

    def _redone(self, commands: list[Command], settlements: list[Settlement], sent: asyncio.Future[list[Any]]) -> None:
        if sent.cancelled():
            return
        if (exc := sent.exception()) is not None:
            if isinstance(exc, RETRYABLE_ERRORS):
                self._redo_later(commands, settlements)  # (Redis away: as after a refusal)
                return
            # The callers find the run's record by themselves, or its lapse.
            logger.warning("replica %s: could not finish %d request(s): %s", self._who, len(commands), exc)
            return
        results = sent.result()
        if settlements:
            self._answer_waiters(settlements, results[: len(settlements)])
        redo = [
            command for command, result in zip(commands, results[len(settlements) :], strict=True) if _again(result)
        ]
        if redo:
            self._redo_later(redo)
        else:
            self._redo_backoff.reset()

    def _answered(self, sent: asyncio.Future[list[Any]]) -> None:
        if sent.cancelled():
            return
        error = sent.exception()
        if error is None:
            error = next((result for result in sent.result() if isinstance(result, Exception)), None)
        if error is not None:  # they find the stored reply by themselves (client/shared_calls.py)
            logger.warning("replica %s: could not answer callers waiting for a run: %s", self._who, error)

    def _refused(self, outgoing: list[Outgoing], results: list[Any]) -> list[Outgoing]:
        """The replies Redis refused for lack of memory (the other failures are logged: nothing would mend them)."""
        refused = []
        for index, failed in enumerate(results):
            if not isinstance(failed, Exception):
                continue
            if index < len(outgoing) and (refuses_writes(failed) or _again(failed)):  # the replies come first
                refused.append(outgoing[index])
                self._refused_why = why_writes_refused(failed) if refuses_writes(failed) else str(failed)
            elif not _again(failed):  # (those go again by themselves: _sent)
                logger.warning("replica %s: finishing requests: %s", self._who, failed)
        return refused

    def _send_again(self, refused: list[Outgoing]) -> None:
        """Send refused replies again, alone and after a pause; a large one as an error reply, none past its
        caller's deadline (that caller has had its timeout: the entry is settled)."""
        now = now_ms()
        late = [out for out in refused if 0 < out[3] < now]
        if late:
            logger.warning(
                "replica %s: Redis took no reply to %d request(s) before their deadlines passed (%s): dropped",
                self._who,
                len(late),
                self._refused_why,
            )
            self._on_finished([entry_id for entry_id, *_ in late])
        again = [self._smaller(out) for out in refused if not 0 < out[3] < now]
        if not again:
            return
        delay = self._refusals.next()
        logger.warning(
            "replica %s: Redis refused %d reply(ies), %s; sending again in %.1fs",
            self._who,
            len(again),
            self._refused_why,
            delay,
        )
        entry_ids = [entry_id for entry_id, *_ in again]
        asyncio.get_running_loop().call_later(delay, self._send, again, entry_ids, False, [], [])

    def _smaller(self, out: Outgoing) -> Outgoing:
        """``out`` itself, or an error reply in its place when its reply is too large to try again."""
        entry_id, reply_to, reply, deadline_ms = out
        size = len(reply.body) + len(reply.error_message)
        if size < LARGE_REPLY_BYTES or self._refused_why != OUT_OF_MEMORY:  # (a full disk refuses any reply alike)
            return out
        logger.error(
            "replica %s: Redis has no memory for the %d-byte reply to request %s: its caller gets an error instead",
            self._who,
            size,
            reply.request_id,
        )
        return entry_id, reply_to, unstorable(reply, size), deadline_ms


def unstorable(reply: Reply, size: int) -> Reply:
    """The error reply that stands in for ``reply`` (``size`` bytes), which Redis had no memory to store."""
    return Reply(
        reply.request_id,
        ReplyStatus.USER_ERROR,
        reply.replica_id,
        error_type=ResponseTooLargeError.__name__,
        error_message=(
            f"the reply is {size} bytes, more than Redis could store: it is out of memory (maxmemory reached); "
            "lower the deployment's max_response_bytes or give Redis more memory"
        ),
        tag=reply.tag,
    )


def _again(result: object) -> bool:
    """Whether a command's ``result`` says it did not run for now and may be sent again: a Redis Cluster's refusal
    (CLUSTERDOWN, TRYAGAIN, MASTERDOWN...) past the round trip's own retries."""
    return isinstance(result, RETRYABLE_ERRORS)
