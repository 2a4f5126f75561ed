"""Work held by a replica that dies is delivered again; a request that keeps killing replicas is dead-lettered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from streamserve import Client, DeadLetterError
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e
REDIS_CLI = str(Path(sys.executable).with_name("redis-cli"))


def test_requests_held_by_a_killed_replica_complete_elsewhere(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        futures = [client.submit("slow", {"seconds": 4}, timeout=30) for _ in range(6)]
        busy: list[dict[str, object]] = []

        def found_a_busy_replica() -> bool:
            # Keep what this look saw: asking again later may find the requests already done.
            replicas = farm.status()["slow"]["replicas"]
            busy[:] = [r for r in replicas if r["ongoing"] > 0 and r["state"] == "RUNNING"]
            return bool(busy)

        wait_for(found_a_busy_replica, 10, "no replica picked up the requests")
        os.kill(int(busy[0]["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        assert [f.result(timeout=30) for f in futures] == [{"slept": 4}] * 6


def test_what_killed_replicas_held_runs_again_side_by_side_within_its_deadline(farm: Farm) -> None:
    """Most deaths are no request's fault (kill -9, a replica out of memory): what the dead held runs again beside the
    rest, not one at a time. Eight calls of 3 s with a 12 s deadline, both replicas killed: one at a time on the two
    replacements, the last would end 12 s after they started, past its deadline."""
    with Client(farm.effective_redis_url) as client, redis.Redis.from_url(farm.effective_redis_url) as r:
        calls = [client.submit("fragile", {"sleep": 3, "i": i}, timeout=12) for i in range(8)]
        held = lambda: r.xpending("streamserve:{fragile}:requests", "replicas")["pending"]  # noqa: E731
        wait_for(lambda: held() == 8, 10, "the calls were not all picked up")
        for replica in farm.status()["fragile"]["replicas"]:
            os.kill(int(replica["pid"]), signal.SIGKILL)
        assert [call.result(timeout=20) for call in calls] == [{"sleep": 3, "i": i} for i in range(8)]
    wait_for(lambda: farm.status()["fragile"]["running"] == 2, 20, "fragile replicas not replaced")


def test_poison_request_goes_to_dead_letters_and_others_are_served(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        poison = client.submit("fragile", "crash", timeout=60)
        assert client.call("fragile", "fine", timeout=30) == "fine"
        with pytest.raises(DeadLetterError, match="delivered 3 times"):
            poison.result(timeout=60)
        assert client.call("fragile", "still fine", timeout=30) == "still fine"
    dead = subprocess.run(
        [REDIS_CLI, "-u", farm.effective_redis_url, "XRANGE", "streamserve:{fragile}:dead", "-", "+"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    assert '"crash"' in dead and "died while running it" in dead
    wait_for(lambda: farm.status()["fragile"]["running"] == 2, 20, "fragile replicas not replaced")


def test_a_poison_request_does_not_take_its_neighbours_to_the_dead_letters(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        neighbours = [client.submit("fragile", {"sleep": 2, "i": i}, timeout=90) for i in range(6)]
        with redis.Redis.from_url(farm.effective_redis_url) as r:
            held = lambda: r.xpending("streamserve:{fragile}:requests", "replicas")["pending"]  # noqa: E731
            wait_for(lambda: held() == 6, 10, "neighbours not picked up")
        poison = client.submit("fragile", {"crash_after": 0.2}, timeout=90)  # dies beside some of them
        assert [f.result(timeout=90) for f in neighbours] == [{"sleep": 2, "i": i} for i in range(6)]
        with pytest.raises(DeadLetterError, match="delivered 3 times and each time its replica died"):
            poison.result(timeout=90)
    wait_for(lambda: farm.status()["fragile"]["running"] == 2, 20, "fragile replicas not replaced")


def scheduler_pids(farm: Farm) -> list[int]:
    return farm.role_pids().get("scheduler", [])


def test_killed_scheduler_is_restarted_and_adopts_the_replicas(farm: Farm) -> None:
    def replica_pids() -> dict[str, list[int]]:
        return {name: sorted(r["pid"] for r in d["replicas"]) for name, d in farm.status().items()}

    wait_for(lambda: all(d["running"] == d["target"] for d in farm.status().values()), 30, "farm not settled")
    before = replica_pids()
    [old] = scheduler_pids(farm)
    os.kill(old, signal.SIGKILL)
    assert farm.post("/echo", "while the scheduler is down").status_code == 200
    wait_for(lambda: len(scheduler_pids(farm)) == 1 and scheduler_pids(farm) != [old], 20, "no new scheduler")
    wait_for(lambda: b"adopted" in farm.log().split(b"restarting it", 1)[-1], 20, "new scheduler did not adopt")
    assert replica_pids() == before  # no duplicates, no restarts
    assert farm.post("/echo", "after").status_code == 200
