"""Response-cache entries kept in the caller's own process (a gateway, a Client) for a moment: hits without Redis.

A hit read from Redis costs the caller a round trip and Redis the enqueue script, about what a miss costs the
gateway that answers it (bench/RESULTS.md, shared runs). An entry read once is kept here for
``response_cache.local_ttl_s`` (1 s by default; never past its expiry in Redis), and the hits on it meanwhile cost a
dictionary lookup.

What a copy may not see, for at most ``local_ttl_s``: a ``Cache-Control: no-cache`` refresh made through another
process (one made through this process drops its copy), and the entry's eviction from Redis past ``max_entries``.
A deploy that changes the code or ``user_config`` changes every digest, so it never meets an old copy.

Hits answered here are counted into the deployment's ``cache_requests_total{result="hit"}`` in Redis, added up and
sent at most once a second (HitCounts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from streamserve.transport.pipelining import Pipeliner
from streamserve.wire.keys import Keys

logger = logging.getLogger(__name__)

# At most this many entries, and about this many bytes of replies, are kept in one process; past either, the
# entries kept longest ago go first. A reply larger than HOT_MAX_REPLY_BYTES is never kept.
HOT_MAX_ENTRIES = 1024
HOT_MAX_BYTES = 16 * 1024 * 1024
HOT_MAX_REPLY_BYTES = 256 * 1024
# Hits answered from kept entries are added to the metrics in Redis at most this far apart.
HIT_COUNT_FLUSH_S = 1.0


class HotEntries:
    """Kept copies of cache entries by digest: the stored fields (shared_runs.stored_reply's) and when they lapse."""

    def __init__(self, max_entries: int = HOT_MAX_ENTRIES, max_bytes: int = HOT_MAX_BYTES) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        # digest -> (monotonic time it lapses, the entry's fields, its size), oldest first (a dict keeps that order)
        self._entries: dict[str, tuple[float, list[bytes], int]] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str) -> list[bytes] | None:
        """The fields kept for ``digest``, or None (none kept, or lapsed)."""
        kept = self._entries.get(digest)
        if kept is None:
            return None
        if kept[0] <= time.monotonic():
            self.drop(digest)
            return None
        return kept[1]

    def keep(self, digest: str, fields: list[bytes], for_s: float) -> None:
        """Keep ``fields`` for ``digest`` for ``for_s`` seconds (nothing when that is not positive, or the reply is
        larger than HOT_MAX_REPLY_BYTES)."""
        size = sum(len(field) for field in fields)
        if for_s <= 0 or size > HOT_MAX_REPLY_BYTES:
            return
        self.drop(digest)
        self._entries[digest] = (time.monotonic() + for_s, fields, size)
        self._bytes += size
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            self.drop(next(iter(self._entries)))

    def drop(self, digest: str) -> None:
        """Forget ``digest``'s copy, if one is kept."""
        kept = self._entries.pop(digest, None)
        if kept is not None:
            self._bytes -= kept[2]


class HitCounts:
    """Hits answered from kept entries, per deployment, added to its metrics hash (``field``) in Redis by one
    HINCRBY each at most every HIT_COUNT_FLUSH_S. A flush that fails keeps its counts for the next; what is not
    flushed when the process dies is lost, as with the rest of a process's last second of metrics."""

    def __init__(self, pipeliner: Pipeliner, keys: Keys, field: str) -> None:
        self._pipeliner = pipeliner
        self._keys = keys
        self._field = field
        self._counts: dict[str, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def add(self, deployment: str) -> None:
        self._counts[deployment] = self._counts.get(deployment, 0) + 1
        self._arm()

    def _arm(self) -> None:
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(HIT_COUNT_FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send the counts so far (they go with the pipeliner's next round trip)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        counts, self._counts = self._counts, {}
        if not counts:
            return
        commands = [("HINCRBY", self._keys.metrics(name), self._field, n) for name, n in counts.items()]
        self._pipeliner.execute(*commands).add_done_callback(lambda sent: self._landed(sent, counts))

    def close(self) -> None:
        """Send what is counted, for the last time (its client is closing)."""
        self.flush()
        self._closed = True

    def _landed(self, sent: asyncio.Future[list[Any]], counts: dict[str, int]) -> None:
        """Keep the counts Redis did not add (the round trip failed, or it refused a command) for the next flush."""
        if sent.cancelled() or sent.exception() is not None:
            failed = counts
        else:
            failed = {
                name: n
                for (name, n), reply in zip(counts.items(), sent.result(), strict=True)
                if isinstance(reply, Exception)
            }
        if not failed:
            return
        logger.debug("%d deployment(s)' cache hits not counted yet, kept for the next flush", len(failed))
        for name, n in failed.items():
            self._counts[name] = self._counts.get(name, 0) + n
        self._arm()
