"""The scheduler's view of the replicas' heartbeats, read in work proportional to what changed.

A tick asks Redis, per deployment, for the heartbeat counter of news and for the replicas whose last beat is older
than the heartbeat timeout (a range of the heartbeat_times sorted set: usually none). It reads the heartbeats hash
again, and parses it, only when the counter moved (control/heartbeats.py). A farm whose replicas merely keep
beating costs two commands per deployment per tick, however many replicas it has.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from streamserve.wire.errors import ProtocolError
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Heartbeat

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Beats:
    """One deployment's heartbeats as one tick sees them.

    ``said``: each replica's last heartbeat that said something new (its ``ts_ms`` is when it said it, not when it
    last beat). ``silent``: the replicas not heard from within the heartbeat timeout, and when they last beat.
    """

    said: Mapping[str, Heartbeat]
    silent: Mapping[str, int]
    now_ms: int

    def last_beat_ms(self, replica_id: str) -> int | None:
        """When the replica last beat: exactly, for a silent one; ``now_ms`` for one heard within the timeout; None
        for one with no heartbeat at all."""
        last = self.silent.get(replica_id)
        if last is not None:
            return last
        return self.now_ms if replica_id in self.said else None

    def heard(self) -> set[str]:
        """The replicas heard from within the heartbeat timeout."""
        return self.said.keys() - self.silent.keys()


@dataclass
class _Known:
    """What the reader holds of one deployment between ticks."""

    news: bytes | None  # the counter's value when the heartbeats hash was last read
    said: dict[str, Heartbeat] = field(default_factory=dict)
    untimed: dict[str, int] = field(default_factory=dict)  # heartbeats with no time in heartbeat_times: their ts_ms


class HeartbeatReader:
    """Keeps each deployment's parsed heartbeats, and re-reads a deployment's only when its replicas had news."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, timeout_ms: int) -> None:
        self._redis = redis
        self._keys = keys
        self._timeout_ms = timeout_ms
        self._known: dict[str, _Known] = {}

    async def read(self, names: Sequence[str], now_ms: int, silence_from_ms: int = 0) -> dict[str, Beats]:
        """The heartbeats of ``names``, in one round trip, plus one more for those whose replicas had news.

        ``silence_from_ms``: no replica counts as silent since before then (Redis was away: nobody could beat).
        """
        cutoff = now_ms - self._timeout_ms
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.get(self._keys.heartbeat_news(name))
                pipe.zrangebyscore(self._keys.heartbeat_times(name), "-inf", f"({cutoff}", withscores=True)
            replies = await pipe.execute()
        news = dict(zip(names, replies[0::2], strict=True))
        expired = dict(zip(names, replies[1::2], strict=True))
        self._known = {name: known for name, known in self._known.items() if name in news}
        changed = [name for name in names if name not in self._known or self._known[name].news != news[name]]
        if changed:
            await self._reread(changed, news)
        beats = {}
        for name in names:
            known = self._known[name]
            silent: dict[str, int] = {}
            if silence_from_ms < cutoff:  # else Redis came back less than a timeout ago: silence counts from then
                silent = {rid.decode(): max(int(ts), silence_from_ms) for rid, ts in expired[name]}
                silent.update((rid, max(ts, silence_from_ms)) for rid, ts in known.untimed.items() if ts < cutoff)
            beats[name] = Beats(known.said, silent, now_ms)
        return beats

    async def _reread(self, names: list[str], news: Mapping[str, bytes | None]) -> None:
        """Read and parse the heartbeats hashes of ``names`` again (with which replicas have a beat time)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(self._keys.heartbeats(name))
                pipe.zrange(self._keys.heartbeat_times(name), 0, -1)
            replies = await pipe.execute()
        for name, raw_beats, timed in zip(names, replies[0::2], replies[1::2], strict=True):
            known = self._known[name] = _Known(news[name])
            timed_ids = set(timed)
            for rid_bytes, raw in raw_beats.items():
                rid = rid_bytes.decode()
                try:
                    beat = Heartbeat.decode(raw)
                except ProtocolError as exc:
                    logger.warning("ignoring unreadable heartbeat of %s: %s", rid, exc)
                    continue
                known.said[rid] = beat
                if rid_bytes not in timed_ids:  # written by something older than heartbeat_times
                    known.untimed[rid] = beat.ts_ms
