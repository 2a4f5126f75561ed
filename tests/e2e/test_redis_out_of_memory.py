"""Redis out of memory for a moment, under several deployments: only the request whose reply cannot be stored fails.

A reply larger than Redis's whole memory is refused (OOM); while its bytes arrive, every other write is refused
too. Its caller gets a 500 saying why at once (not a 504 at its deadline); the other deployments' replicas keep
beating (none is declared dead and replaced) and their callers get their answers, even those whose replies were
refused while Redis was full (for about a second, longer than a moment and shorter than the heartbeat timeout).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from streamserve.wire.keys import CONSUMER_GROUP, Keys
from tests.harness.farm import FAST_HEARTBEATS, Farm, farm_on
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

STEADY = ("steady_a", "steady_b")
CONFIG = """
deployments:
  - name: big
    import_path: tests.deployments:sized
    max_response_bytes: 67108864
  - name: steady_a
    import_path: tests.deployments:whoami
    num_replicas: 2
  - name: steady_b
    import_path: tests.deployments:whoami
    num_replicas: 2
"""
ROOMY = "1gb"  # the farm's Redis while it starts: max_response_bytes (64 MiB) is within a tenth of it
TIGHT = 32 * 2**20  # then: less than the big reply
BIG_BYTES = 40 * 2**20
BEAT_TIMEOUT_S = float(FAST_HEARTBEATS["STREAMSERVE_HEARTBEAT_TIMEOUT_S"])
FULL_FOR_S = 1.0  # how long no heartbeat lands: several heartbeat intervals, under the heartbeat timeout


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    farm = farm_on(CONFIG, tmp_path)
    farm.extra_args = ["--redis-maxmemory", ROOMY]
    farm.start()
    try:
        wait_for(lambda: all(d["running"] == d["target"] for d in farm.status().values()), 60, "replicas not up")
        yield farm
    finally:
        farm.stop()


def call(url: str, body: Any, timeout_s: float) -> tuple[int, Any, float]:
    """POST ``body`` with a deadline of ``timeout_s``: the status, the JSON answer and how long it took."""
    started = time.monotonic()
    response = httpx.post(url, json=body, headers={"X-Request-Timeout": str(timeout_s)}, timeout=timeout_s + 10)
    return response.status_code, response.json(), time.monotonic() - started


def test_a_reply_redis_cannot_store_fails_alone(farm: Farm, tmp_path: Path) -> None:
    admin = redis.Redis.from_url(farm.effective_redis_url, socket_timeout=5)
    keys = Keys()
    hold = tmp_path / "hold"
    replicas_before = running_replicas(farm)
    assert len(replicas_before) == 5, replicas_before
    try:
        with ThreadPoolExecutor(8) as pool:
            try:
                # A moment: the big reply arrives at a Redis too small for it, while the other deployments serve.
                admin.config_set("maxmemory", TIGHT)
                steady = [pool.submit(call, f"{farm.base_url}/{name}", {"n": n}, 15) for name in STEADY for n in (0, 1)]
                status, answer, took = call(f"{farm.base_url}/big", {"bytes": BIG_BYTES}, 10)
                assert status == 500, answer
                assert answer["error"] == "ResponseTooLargeError", answer
                assert "out of memory" in answer["message"] and str(BIG_BYTES + 2) in answer["message"], answer
                assert took < 6, f"the big request's caller waited {took:.1f} s for its error"
                assert_answered(steady)

                # Longer: Redis refuses every write while the other deployments' handlers finish.
                held = [
                    pool.submit(call, f"{farm.base_url}/{name}", {"n": n, "wait_for": str(hold)}, 15)
                    for name in STEADY
                    for n in (0, 1)
                ]
                wait_for(lambda: pending(admin, keys) == len(held), 10, "the held requests did not reach the replicas")
                admin.config_set("maxmemory", 1)
                hold.touch()
                # Their replies were refused (not the acknowledgements that went with them: XACK needs no memory),
                # and so were several rounds of heartbeats.
                wait_for(lambda: pending(admin, keys) == 0, 10, "the held requests were not finished")
                wait_for(lambda: silent_for(admin, keys) >= FULL_FOR_S, FULL_FOR_S + 2, "heartbeats were not refused")
                admin.config_set("maxmemory", ROOMY)
                assert_answered(held)
            finally:
                hold.touch()  # the held calls end (bounded) whatever happened
                admin.config_set("maxmemory", ROOMY)
        # Every replica beats again, and none was replaced.
        wait_for(lambda: beats_are_fresh(admin, keys), BEAT_TIMEOUT_S, "some replicas stopped beating")
        assert running_replicas(farm) == replicas_before
        # Each replica said once that Redis refused its beats, not once a beat.
        log = farm.log().decode()
        assert "heartbeat failed" not in log, log[-5000:]
        for replica in replicas_before:
            assert log.count(f"replica {replica}: Redis refuses writes, it is out of memory") <= 1, log[-5000:]
    finally:
        admin.close()


def test_a_keyed_reply_kept_though_redis_refused_its_copy_reaches_its_caller(farm: Farm, tmp_path: Path) -> None:
    """The run's reply is kept under its idempotency key (it fitted), then Redis is full and refuses the caller's
    copy of it: the caller, at its deadline, takes the kept reply (it waited 504 while a retry got it at once)."""
    admin = redis.Redis.from_url(farm.effective_redis_url, socket_timeout=5)
    hold = tmp_path / "hold-keyed"
    size = 4 * 2**20
    body = {"bytes": size, "wait_for": str(hold)}
    headers = {"X-Request-Timeout": "6", "Idempotency-Key": "kept-not-sent"}
    try:
        with ThreadPoolExecutor(1) as pool:
            try:
                sent = pool.submit(httpx.post, f"{farm.base_url}/big", json=body, headers=headers, timeout=30)
                wait_for(lambda: held_by(admin, "big") == 1, 10, "the keyed request did not reach its replica")
                used = int(admin.info("memory")["used_memory"])
                admin.config_set("maxmemory", used + size // 2)  # room for the kept reply, not for its copy too
                hold.touch()
                answer = sent.result(timeout=30)
            finally:
                hold.touch()
                admin.config_set("maxmemory", ROOMY)
        assert answer.status_code == 200, answer.text[:500]
        assert answer.json() == "x" * size
    finally:
        admin.close()


def held_by(admin: redis.Redis, deployment: str) -> int:
    """Requests of ``deployment`` its replicas hold (delivered, not yet acknowledged)."""
    return sum(int(group["pending"]) for group in admin.xinfo_groups(Keys().requests(deployment)))


def running_replicas(farm: Farm) -> dict[str, int]:
    """replica id -> pid of every RUNNING replica of the farm."""
    status = farm.status()
    return {r["replica_id"]: r["pid"] for d in status.values() for r in d["replicas"] if r["state"] == "RUNNING"}


def assert_answered(calls: list[Future[tuple[int, Any, float]]]) -> None:
    answers = [f.result(timeout=30) for f in calls]
    assert [status for status, _, _ in answers] == [200] * len(calls), answers


def pending(admin: redis.Redis, keys: Keys) -> int:
    """Requests the steady deployments' replicas hold (delivered, not yet acknowledged)."""
    total = 0
    for name in STEADY:
        for group in admin.xinfo_groups(keys.requests(name)):
            if group["name"].decode() == CONSUMER_GROUP:
                total += int(group["pending"])
    return total


def beat_times(admin: redis.Redis, keys: Keys) -> list[float]:
    """When each replica of the farm last beat (epoch ms)."""
    return [
        ts for name in ("big", *STEADY) for _, ts in admin.zrange(keys.heartbeat_times(name), 0, -1, withscores=True)
    ]


def silent_for(admin: redis.Redis, keys: Keys) -> float:
    """Seconds since the last heartbeat of any replica landed."""
    return time.time() - max(beat_times(admin, keys)) / 1000


def beats_are_fresh(admin: redis.Redis, keys: Keys) -> bool:
    """Whether every replica beat within the last half of the heartbeat timeout."""
    now_ms = time.time() * 1000
    return all(now_ms - ts < BEAT_TIMEOUT_S * 500 for ts in beat_times(admin, keys))
