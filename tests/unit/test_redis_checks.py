"""When a process warns that its Redis may lose the farm's work, and what the warning says."""

from __future__ import annotations

import pytest

from streamserve.transport.redis_checks import RedisDurability, problems, warning_text

DURABLE = RedisDurability(aof_enabled=True, save_points=None, maxmemory_policy="noeviction")


@pytest.mark.parametrize(
    "found",
    [
        DURABLE,  # the embedded Redis of `up`: AOF on, noeviction
        RedisDurability(aof_enabled=False, save_points="3600 1 300 100 60 10000", maxmemory_policy="noeviction"),
        # CONFIG renamed (managed Redis) or forbidden (an ACL user): the save points are unknown, so no claim.
        RedisDurability(aof_enabled=False, save_points=None, maxmemory_policy="noeviction"),
        RedisDurability(aof_enabled=None, save_points=None, maxmemory_policy=None),  # INFO said nothing
    ],
)
def test_a_redis_that_keeps_the_work_or_cannot_tell_gets_no_warning(found: RedisDurability) -> None:
    assert problems(found) == []


def test_persistence_off_names_the_risk_and_the_fix() -> None:
    (line,) = problems(RedisDurability(aof_enabled=False, save_points="", maxmemory_policy="noeviction"))
    assert "persistence is off" in line and "restart loses every queued request" in line
    assert "appendonly yes" in line and "CONFIG SET appendonly yes" in line


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "allkeys-random", "volatile-ttl"])
def test_any_evicting_policy_names_itself_and_the_fix(policy: str) -> None:
    (line,) = problems(RedisDurability(aof_enabled=True, save_points=None, maxmemory_policy=policy))
    assert f"maxmemory-policy is {policy}" in line and "evicts keys" in line
    assert "CONFIG SET maxmemory-policy noeviction" in line


def test_both_problems_make_one_warning_with_a_line_each_and_no_password() -> None:
    lines = problems(RedisDurability(aof_enabled=False, save_points="", maxmemory_policy="allkeys-lru"))
    text = warning_text("redis://user:s3cret@redis.example:6379/0", lines)
    assert text.splitlines()[0] == "Redis at redis://***@redis.example:6379/0 may lose the farm's work:"
    assert len(text.splitlines()) == 3 and "s3cret" not in text
