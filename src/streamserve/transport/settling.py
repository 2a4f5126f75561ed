"""Ending a shared run (wire/shared_runs.py): the SETTLE_RUN command, and the answers to the callers that joined it.

A replica settles a run in the same round trip as its reply and acknowledgement
(workers/finisher.py); a caller that cancels a queued run, and the reclaimer
that dead-letters one, release it here. Either way the callers that joined
the run get a copy of its reply, or RETRY when its handler never ran to its end
(they send their calls again).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from streamserve.transport.pipelining import Command, Script
from streamserve.transport.streams import DeadLetter, reply_command
from streamserve.wire import idempotency, response_cache, scripts, shared_runs
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms

# Sent by its SHA1 with a replica's reply (its 2 KB source cost Redis a hash of it on every keyed or cached call);
# a Redis that does not know it (restarted, flushed) is sent the source (Settlement.with_source) and learns it.
_SETTLE_RUN = Script(scripts.SETTLE_RUN)
# The ends of a run whose handler never ran to its end: its waiters run their calls anew instead of sharing it.
_NEVER_RAN = frozenset(
    {ReplyStatus.CANCELLED, ReplyStatus.DEADLINE_EXCEEDED, ReplyStatus.DEAD_LETTER, ReplyStatus.GONE}
)


@dataclasses.dataclass(slots=True)
class Settlement:
    """How one run ends: its SETTLE_RUN command, and what the callers waiting for it get."""

    command: Command
    # What the run's waiters get (each with its own request id and tag): the run's reply, or RETRY.
    reply: Reply

    def with_source(self) -> Command:
        """The command as EVAL with the script's source, for a Redis that answered its EVALSHA with NOSCRIPT."""
        return ("EVAL", _SETTLE_RUN.source, *self.command[2:])

    def answers(self, result: Any) -> list[Command]:
        """The replies to the waiters that SETTLE_RUN returned (``result``)."""
        if not isinstance(result, list):
            return []
        return [
            reply_command(reply_to, dataclasses.replace(self.reply, request_id=request_id, tag=tag))
            for reply_to, tag, request_id in shared_runs.waiters(result)
        ]


def settle(keys: Keys, cfg: DeploymentConfig, request: Request, reply: Reply, *, keep: bool = True) -> Settlement:
    """The settlement of ``request``'s shared run (it has ``idem`` or ``cache``), which ended with ``reply``.
    ``keep``: False for a cache's run whose reply may not be of the config it was asked under (freed, not kept)."""
    name = cfg.name
    cache_args: list[EncodableT]
    if request.idem:
        outcome, fields = idempotency.settlement(reply)
        run_keys = list(keys.shared_run(name, request.idem, "", request.tenant))
        ttl_s, cache_args = cfg.idempotency_ttl_s, [0, "", ""]
        shared = outcome == shared_runs.STORE
    else:
        cache = cfg.response_cache
        digest = response_cache.cache_digest(cfg, request.method, request.body, request.model, request.tenant)
        kept = keep and cache is not None and digest == request.cache
        outcome, fields = response_cache.settlement(reply, kept)
        run_keys = [*keys.shared_run(name, "", request.cache), keys.cache_index(name)]
        ttl_s = cache.ttl_s if cache is not None else 0
        cache_args = [cache.max_entries if cache is not None else 0, request.cache, keys.cache_entry(name, "")]
        # A run that failed failed for all of them. One that streamed sent its chunks to its own caller only (a
        # streaming handler has no cache, but old replicas serve on when an update that adds one fails): they run
        # anew, as for a run that never ran.
        shared = reply.status not in _NEVER_RAN and reply.status is not ReplyStatus.END
    command: Command = (
        "EVALSHA",
        _SETTLE_RUN.sha,
        len(run_keys),
        *run_keys,
        request.run,
        outcome,
        int(ttl_s * 1000),
        *cache_args,
        now_ms(),
        *fields,
    )
    return Settlement(command, reply if shared else Reply(reply.request_id, ReplyStatus.RETRY, reply.replica_id))


async def release(redis: aioredis.Redis, keys: Keys, deployment: str, request: Request | DeadLetter) -> None:
    """Free ``request``'s shared run (of its idempotency key, or of its cache digest) that never ran (cancelled while
    queued, dead-lettered), and tell its waiters to send their calls again."""
    run_keys = keys.shared_run(deployment, request.idem, request.cache, request.tenant)
    release_args = (request.run, shared_runs.RELEASE, 0, 0, "", "", now_ms())
    command: Command = ("EVALSHA", _SETTLE_RUN.sha, len(run_keys), *run_keys, *release_args)
    settlement = Settlement(command, Reply("", ReplyStatus.RETRY, ""))
    try:  # (a timed-out caller's queued request is released this way: not so rare that 2 KB of source go each time)
        result = await redis.execute_command(*command)  # type: ignore[no-untyped-call]
    except NoScriptError:
        result = await redis.execute_command(*settlement.with_source())  # type: ignore[no-untyped-call]
    for answer in settlement.answers(result):
        await redis.execute_command(*answer)  # type: ignore[no-untyped-call]
