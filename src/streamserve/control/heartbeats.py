"""The one owner of a deployment's heartbeat keys: how replicas write them, and how they are removed.

Each beat writes three keys of the deployment (one slot, one transaction):

- ``heartbeats``: replica id -> the Heartbeat JSON (what ``status`` and the dashboard show);
- ``heartbeat_times``: replica id -> when it beat, a sorted set, so that the scheduler finds the replicas that went
  silent with one range query instead of reading every heartbeat;
- ``heartbeat_news``: a counter, bumped only by a beat that says something new to the scheduler (health, message,
  version, pid or host: ``news_of``), and by a removal. The scheduler reads the heartbeats hash again only when it
  moved: at 100,000 replicas, parsing every heartbeat every tick was a third of the tick (bench/scale_sim.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streamserve.wire.keys import Keys
from streamserve.wire.messages import Heartbeat

# What a replica's heartbeat says that the scheduler acts on; the time and the in-flight count are not news.
News = tuple[str, str, str, int, str, str, str]


def news_of(beat: Heartbeat) -> News:
    """The part of ``beat`` whose change the scheduler must hear about."""
    return (
        beat.health.value,
        beat.message,
        beat.version,
        beat.pid,
        beat.host,
        beat.user_config,
        beat.refused_user_config,
    )


def queue_beats(pipe: Any, keys: Keys, deployment: str, beats: Mapping[str, tuple[int, bytes]], news: bool) -> None:
    """Queue on ``pipe`` (a transaction) the beats of some replicas of one deployment: replica id -> (time,
    encoded Heartbeat). ``news``: one of them says something new (or is the first beat of its replica)."""
    pipe.hset(keys.heartbeats(deployment), mapping={rid: encoded for rid, (_, encoded) in beats.items()})
    pipe.zadd(keys.heartbeat_times(deployment), {rid: ts for rid, (ts, _) in beats.items()})
    if news:
        pipe.incr(keys.heartbeat_news(deployment))


def queue_removal(pipe: Any, keys: Keys, deployment: str, replica_ids: Iterable[str]) -> None:
    """Queue on ``pipe`` the removal of some replicas' heartbeats (gone, or replaced by another process)."""
    rids = list(replica_ids)
    if rids:
        pipe.hdel(keys.heartbeats(deployment), *rids)
        pipe.zrem(keys.heartbeat_times(deployment), *rids)
        pipe.incr(keys.heartbeat_news(deployment))
