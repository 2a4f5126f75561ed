"""The caller's own copies of response-cache entries (client/hot_entries.py): how long they answer, and their bound."""

from __future__ import annotations

import pytest

from streamserve.client import hot_entries
from streamserve.client.hot_entries import HOT_MAX_REPLY_BYTES, HotEntries
from streamserve.wire.config import DeploymentConfig, ResponseCacheConfig
from streamserve.wire.errors import ConfigError

FIELDS = [b"ok", b"42", b"", b"", b"r1", b""]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(hot_entries.time, "monotonic", clock)
    return clock


def test_a_copy_answers_until_its_time_is_up(clock: Clock) -> None:
    hot = HotEntries()
    hot.keep("d1", FIELDS, 1.0)
    clock.now += 0.999
    assert hot.get("d1") == FIELDS
    clock.now += 0.001
    assert hot.get("d1") is None
    assert len(hot) == 0  # a lapsed copy is dropped when found


def test_nothing_is_kept_for_no_time_or_when_too_large(clock: Clock) -> None:
    hot = HotEntries()
    hot.keep("zero", FIELDS, 0.0)  # local_ttl_s: 0, or the entry has no time left in Redis
    hot.keep("large", [b"ok", b"x" * (HOT_MAX_REPLY_BYTES + 1)], 1.0)
    assert hot.get("zero") is None and hot.get("large") is None


def test_past_the_bounds_the_copies_kept_longest_ago_go_first(clock: Clock) -> None:
    hot = HotEntries(max_entries=3, max_bytes=100)
    for digest in ("a", "b", "c", "d"):
        hot.keep(digest, [b"ok", b"1"], 5.0)
    assert [hot.get(d) is not None for d in "abcd"] == [False, True, True, True]
    hot.keep("big", [b"ok", b"x" * 97], 5.0)  # 99 bytes: only it fits with 100 at most
    assert len(hot) == 1 and hot.get("big") is not None


def test_a_dropped_copy_is_gone_and_its_bytes_free(clock: Clock) -> None:
    hot = HotEntries(max_entries=10, max_bytes=10)
    hot.keep("a", [b"ok", b"12345678"], 5.0)
    hot.drop("a")
    hot.drop("never kept")
    hot.keep("b", [b"ok", b"12345678"], 5.0)
    assert hot.get("a") is None and hot.get("b") is not None


@pytest.mark.parametrize("value", [-1, 61, float("nan"), float("inf")])
def test_local_ttl_s_out_of_range_is_a_config_error(value: float) -> None:
    with pytest.raises((ConfigError, ValueError), match="local_ttl_s"):
        DeploymentConfig.model_validate(
            {"name": "c", "import_path": "m:f", "response_cache": {"ttl_s": 60, "local_ttl_s": value}}
        )


def test_local_ttl_s_restarts_no_replica() -> None:
    """Only callers read it: the code version, which replicas roll on and cache digests name, leaves it out."""

    def version(local_ttl_s: float) -> str:
        cache = ResponseCacheConfig(ttl_s=60, local_ttl_s=local_ttl_s)
        return DeploymentConfig(name="c", import_path="m:f", response_cache=cache).code_version()

    assert version(0) == version(1) == version(30)
