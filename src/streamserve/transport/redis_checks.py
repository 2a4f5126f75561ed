"""Whether the farm's Redis keeps the work it is given; every process warns once at start when it may not.

Queued requests, accepted jobs and deployments live only in Redis. A Redis
with persistence off loses them all when it restarts; one whose
``maxmemory-policy`` evicts drops them silently when it fills (Sidekiq warns
the same way). The settings are read with INFO, which managed Redis services
allow even where CONFIG is renamed; the RDB save points need CONFIG GET and
are read only where it is allowed. A setting that cannot be read is not
warned about, and an unreachable Redis is not either: the process reports
that itself. ``up`` also says when it starts on a Redis that is full
(``full_memory_warning``): such a Redis refuses whatever the farm would
write. Deploys read its ``maxmemory`` here too (``read_maxmemory``), to
hold each deployment's ``max_response_bytes`` to a tenth of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from streamserve.transport.connections import one_shot_redis, redacted

PERSISTENCE_OFF = (
    "persistence is off (no AOF, no RDB save points): a Redis restart loses every queued request, accepted job "
    "and deployment. Fix: 'appendonly yes' and 'appendfsync everysec' in redis.conf "
    "(or CONFIG SET appendonly yes, then CONFIG REWRITE)"
)
EVICTING = (
    "maxmemory-policy is {policy}: a full Redis evicts keys, queued requests and jobs included, without a word. "
    "Fix: 'maxmemory-policy noeviction' in redis.conf (or CONFIG SET maxmemory-policy noeviction, then "
    "CONFIG REWRITE); a full Redis then refuses new work (callers get 503) instead of losing it"
)

FULL = (
    "Redis at {url} is out of memory: {used} used, maxmemory {maxmemory}. Until it has room it refuses every write: "
    "calls and asynchronous jobs get 503 (OverloadedError), replicas cannot start, and what is already there (job "
    "results, status) can still be read. Fix: a larger maxmemory (--redis-maxmemory for the embedded Redis, or "
    "CONFIG SET maxmemory), or fewer queued jobs and shorter result TTLs (max_queued_jobs, "
    "STREAMSERVE_JOB_RESULT_TTL_S)"
)


@dataclass(frozen=True)
class RedisDurability:
    """What a Redis says about keeping data; None where it would not say."""

    aof_enabled: bool | None
    save_points: str | None  # CONFIG GET save: "" when RDB snapshots are off
    maxmemory_policy: str | None


def problems(found: RedisDurability) -> list[str]:
    """One line per way this Redis may lose the farm's work (none: it keeps it)."""
    lines = []
    if found.aof_enabled is False and found.save_points is not None and not found.save_points.strip():
        lines.append(PERSISTENCE_OFF)
    if found.maxmemory_policy is not None and found.maxmemory_policy != "noeviction":
        lines.append(EVICTING.format(policy=found.maxmemory_policy))
    return lines


def warning_text(url: str, lines: list[str]) -> str:
    """The one warning a process gives for ``lines`` (from ``problems``)."""
    return f"Redis at {redacted(url)} may lose the farm's work:\n" + "\n".join(f"  - {line}" for line in lines)


def read_durability(url: str) -> RedisDurability | None:
    """Ask the Redis at ``url``; None when it cannot be reached (or refuses us) within one_shot_redis's bound."""
    client = one_shot_redis(url, decode_responses=True)
    try:
        persistence = _info(client, "persistence")
        memory = _info(client, "memory")
        if persistence is None or memory is None:
            return None
        aof = persistence.get("aof_enabled")
        policy = memory.get("maxmemory_policy")
        return RedisDurability(
            aof_enabled=None if aof is None else str(aof) == "1",
            save_points=_save_points(client) if aof is not None and str(aof) != "1" and _may_config(client) else None,
            maxmemory_policy=None if policy is None else str(policy),
        )
    finally:
        client.close()


def full_memory_warning(url: str) -> str | None:
    """What a Redis that is out of memory (maxmemory reached) refuses, and the fix; None when it has room (or cannot
    be asked)."""
    client = one_shot_redis(url, decode_responses=True)
    try:
        memory = _info(client, "memory")
    finally:
        client.close()
    if memory is None:
        return None
    try:
        maxmemory = int(str(memory.get("maxmemory", 0)))
        # Redis 7 leaves replication and AOF buffers out of the figure it holds against maxmemory.
        used = int(str(memory.get("used_memory", 0))) - int(str(memory.get("mem_not_counted_for_evict", 0)))
    except ValueError:
        return None
    if not 0 < maxmemory <= used:
        return None
    return FULL.format(url=redacted(url), used=_megabytes(used), maxmemory=_megabytes(maxmemory))


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f}mb"


def redis_problems(url: str) -> list[str]:
    """``problems`` of the Redis at ``url``; none when it cannot be asked."""
    found = read_durability(url)
    return [] if found is None else problems(found)


def _info(client: redis.Redis, section: str) -> dict[str, object] | None:
    try:
        info: dict[str, object] = client.info(section)
    except redis.RedisError:
        return None
    return info


def _may_config(client: redis.Redis) -> bool:
    """Whether to ask CONFIG at all: not as a named ACL user, who (like the one docs/operations.md prints) is rarely
    allowed it and whose denial would land in Redis's ACL LOG on every process start."""
    user = client.connection_pool.connection_kwargs.get("username")
    return user in (None, "", "default")


def _save_points(client: redis.Redis) -> str | None:
    """The RDB save points, or None where CONFIG is renamed or forbidden (managed Redis, an ACL user)."""
    try:
        reply = client.config_get("save")
    except redis.RedisError:
        return None
    value = reply.get("save")
    return None if value is None else str(value)


async def read_maxmemory(client: aioredis.Redis) -> int | None:
    """Redis's memory limit in bytes, from INFO (allowed where CONFIG is not); None when it has none or will not
    say (INFO refused, as an ACL user may be). On a Redis Cluster, the smallest of its nodes' limits."""
    try:
        info = await client.info("memory")
    except redis.ResponseError:
        return None
    # One server answers its own fields; a cluster client, one set of fields per node.
    answers = [info] if "maxmemory" in info else [v for v in info.values() if isinstance(v, dict)]
    limits = [int(answer["maxmemory"]) for answer in answers if int(answer.get("maxmemory", 0)) > 0]
    return min(limits) if limits else None
