"""Whether the farm's Redis keeps the work it is given; every process warns once at start when it may not.

Queued requests, accepted jobs and deployments live only in Redis. A Redis
with persistence off loses them all when it restarts; one whose
``maxmemory-policy`` evicts drops them silently when it fills (Sidekiq warns
the same way). The settings are read with INFO, which managed Redis services
allow even where CONFIG is renamed; the RDB save points need CONFIG GET and
are read only where it is allowed. A setting that cannot be read is not
warned about, and an unreachable Redis is not either: the process reports
that itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamserve.transport.connections import QUIET_HANDSHAKE, redacted

# The check must never hold up a process's start for long.
CHECK_TIMEOUT_S = 1.0

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
    """Ask the Redis at ``url``; None when it cannot be reached (or refuses us) within CHECK_TIMEOUT_S."""
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=CHECK_TIMEOUT_S,
        socket_timeout=CHECK_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
        **QUIET_HANDSHAKE,
    )
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
