"""Priorities end to end (issue 30): `streamserve up`, its gateway, scheduler and replica processes, HTTP callers with
``X-Priority`` and the Python client with ``priority=``.

The order in which requests ran is what the handler recorded on a Redis list (tests/priority_deployments.py)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import statistics
import threading
from collections.abc import Iterator

import httpx
import pytest
import redis

from streamserve import BadRequestError, Client
from streamserve.wire.errors import DeadLetterError
from streamserve.wire.keys import Keys
from streamserve.wire.priorities import Priority
from tests.harness.farm import Farm, running_farm_of
from tests.harness.waiting import wait_for
from tests.priority_deployments import order_key, overlaps_key, pids_key

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: ordered
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 2
  - name: busy
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_ongoing_requests: 2
    graceful_shutdown_timeout_s: 2
  - name: sturdy
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: fragile
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_delivery_attempts: 1
    graceful_shutdown_timeout_s: 2
"""
KEYS = Keys()
WAIT_S = 30.0


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("priorities")) as farm:
        yield farm


def ran(store: redis.Redis, tag: str) -> list[str]:
    """The labels of the requests tagged ``tag`` that ran, in the order they started."""
    return [label.decode() for label in store.lrange(order_key(tag), 0, -1)]


def hold_the_replica(client: Client, store: redis.Redis, deployment: str, tag: str, blockers: int = 1) -> str:
    """Occupy every slot of ``deployment``'s replica with a request that runs until the returned key is deleted."""
    hold = f"hold:{tag}"
    store.set(hold, 1)
    for i in range(blockers):
        client.send(deployment, {"tag": tag, "label": f"blocker-{i}", "hold": hold})
    wait_for(lambda: len(ran(store, tag)) == blockers, WAIT_S, "the blockers did not start")
    return hold


def test_replicas_take_high_before_normal_before_low_and_status_shows_the_queues(
    farm: Farm, store: redis.Redis, client: Client, tag: str
) -> None:
    hold = hold_the_replica(client, store, "ordered", tag)
    # Sent lowest first: first come, first served would run them in this order.
    for level in ("low", "normal", "high"):
        for i in range(12):
            client.send("ordered", {"tag": tag, "label": f"{level}-{i}", "limit": 1}, priority=level)
    status = farm.status()["ordered"]
    assert status["queued_by_priority"] == {"high": 12, "normal": 12, "low": 12}
    assert status["queued"] == 36
    assert "36 (high 12, low 12)" in farm.cli("status").stdout
    # Each level is a stream of its own, for redis-cli too (normal's holds the blocker as well, until it ends).
    assert [store.xlen(KEYS.requests("ordered", p)) for p in Priority] == [12, 13, 12]

    store.delete(hold)
    wait_for(lambda: len(ran(store, tag)) == 37, WAIT_S, "not every request ran")
    levels = [label.split("-")[0] for label in ran(store, tag)[1:]]
    # Of every 6 reads, 4 take high, 1 normal, 1 low (FAIR_TURNS): all 12 high ones run within the first 18.
    first = levels[:18]
    assert first.count("high") == 12, levels
    assert "normal" in first and "low" in first, levels  # the others are not starved meanwhile
    mean = {level: statistics.mean(i for i, x in enumerate(levels) if x == level) for level in set(levels)}
    assert mean["high"] < mean["normal"] < mean["low"], levels
    # One slot: a read that found all three levels ran one request and handed the others back, never three at once.
    assert store.llen(overlaps_key(tag)) == 0
    assert farm.status()["ordered"]["queued_by_priority"] == {"high": 0, "normal": 0, "low": 0}
    # Each was acknowledged on its own level's stream: nothing stays in flight, no stream keeps an entry.
    wait_for(lambda: farm.status()["ordered"]["in_flight"] == 0, WAIT_S, "requests stayed in flight")
    assert [store.xlen(KEYS.requests("ordered", p)) for p in Priority] == [0, 0, 0]


def test_low_gets_at_least_a_tenth_of_the_completions_while_high_keeps_the_replica_saturated(
    farm: Farm, store: redis.Redis, client: Client, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = hold_the_replica(client, store, "busy", tag, blockers=2)
    lows = 20
    for i in range(lows):
        client.send("busy", {"tag": tag, "label": f"low-{i}", "work_s": 0.01}, priority="low")
    done = threading.Event()

    def flood(worker: int) -> int:
        """Keep high requests queued (8 callers for 2 slots) until every low one has run; how many were sent."""
        sent = 0
        while not done.is_set() and sent < 200:
            client.call("busy", {"tag": tag, "label": f"high-{worker}-{sent}", "work_s": 0.01}, priority="high")
            sent += 1
        return sent

    callers = [pool.submit(flood, worker) for worker in range(8)]
    wait_for(lambda: store.xlen(KEYS.requests("busy", Priority.HIGH)) >= 4, WAIT_S, "high requests did not queue")
    store.delete(hold)
    try:
        wait_for(lambda: _all_low_ran(store, tag, lows), WAIT_S, "the low requests did not all run")
    finally:
        done.set()
        sent = sum(caller.result(timeout=WAIT_S) for caller in callers)
    labels = ran(store, tag)[2:]
    last_low = max(i for i, label in enumerate(labels) if label.startswith("low"))
    window = labels[: last_low + 1]  # while low requests were queued
    low_share = sum(label.startswith("low") for label in window) / len(window)
    assert low_share >= 0.1, f"low ran {low_share:.0%} of {len(window)} while queued ({sent} high sent)"
    assert low_share <= 0.5, f"high was not served first: low ran {low_share:.0%} of {len(window)}"


def _all_low_ran(store: redis.Redis, tag: str, lows: int) -> bool:
    return sum(label.startswith("low") for label in ran(store, tag)) == lows


@pytest.mark.parametrize("header", ["urgent", "", "high,low", "1"])
def test_an_unknown_priority_header_is_400_and_runs_nothing(
    farm: Farm, store: redis.Redis, tag: str, header: str
) -> None:
    answer = httpx.post(
        farm.base_url + "/ordered", json={"tag": tag, "label": "x"}, headers={"X-Priority": header}, timeout=30
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "BadRequestError"
    assert "X-Priority" in answer.json()["message"] and "high, normal, low" in answer.json()["message"]
    assert ran(store, tag) == []


def test_the_header_in_any_case_is_taken(farm: Farm, store: redis.Redis, tag: str) -> None:
    answer = httpx.post(
        farm.base_url + "/ordered", json={"tag": tag, "label": "x"}, headers={"X-Priority": "HIGH"}, timeout=30
    )
    assert answer.status_code == 200
    assert ran(store, tag) == ["x"]


def test_an_unknown_priority_from_python_is_a_bad_request_and_sends_nothing(
    client: Client, store: redis.Redis, tag: str
) -> None:
    body = {"tag": tag, "label": "x"}
    for send in (client.call, client.submit, client.send, client.submit_job):
        with pytest.raises(BadRequestError, match="unknown priority 'urgent': use one of high, normal, low"):
            send("ordered", body, priority="urgent")  # type: ignore[operator]
    with pytest.raises(BadRequestError, match="unknown priority"):
        next(iter(client.stream("ordered", body, priority="urgent")))
    assert ran(store, tag) == []


def test_a_job_runs_at_its_priority(farm: Farm, store: redis.Redis, client: Client, tag: str) -> None:
    hold = hold_the_replica(client, store, "ordered", tag)
    answer = httpx.post(
        farm.base_url + "/ordered",
        json={"tag": tag, "label": "job"},
        headers={"Prefer": "respond-async", "X-Priority": "low"},
        timeout=30,
    )
    assert answer.status_code == 202
    low = KEYS.requests("ordered", Priority.LOW)
    job_url = farm.base_url + answer.headers["location"]
    wait_for(
        lambda: store.xlen(low) == 1, WAIT_S, lambda: f"the job's call was not queued at low: {httpx.get(job_url).text}"
    )
    store.delete(hold)
    wait_for(lambda: httpx.get(job_url, timeout=30).json()["status"] == "finished", WAIT_S, "the job did not finish")
    assert httpx.get(job_url, timeout=30).json()["result"] == {"label": "job"}


def test_a_low_request_past_its_deadline_in_the_queue_never_runs(
    farm: Farm, store: redis.Redis, client: Client, tag: str
) -> None:
    hold = hold_the_replica(client, store, "ordered", tag)
    answer = httpx.post(
        farm.base_url + "/ordered",
        json={"tag": tag, "label": "late"},
        headers={"X-Priority": "low", "X-Request-Timeout": "0.5"},
        timeout=30,
    )
    assert answer.status_code == 504
    store.delete(hold)
    assert client.call("ordered", {"tag": tag, "label": "after"}, priority="low") == {"label": "after"}
    assert ran(store, tag) == ["blocker-0", "after"]


def test_a_high_request_held_by_a_replica_that_dies_runs_again_on_another(
    farm: Farm, store: redis.Redis, client: Client, tag: str
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    call = client.submit("sturdy", {"tag": tag, "label": "h", "hold": hold}, priority="high", timeout=60)
    wait_for(lambda: len(ran(store, tag)) == 1, WAIT_S, "the request did not start")
    first_pid = int(store.lindex(pids_key(tag), 0))
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: len(ran(store, tag)) == 2, WAIT_S * 2, "the request was not run again")
    store.delete(hold)
    assert call.result(timeout=WAIT_S) == {"label": "h"}
    assert int(store.lindex(pids_key(tag), 1)) != first_pid


def test_a_low_request_dead_lettered_keeps_its_priority(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)

    def post() -> httpx.Response:
        body = {"tag": tag, "label": "doomed", "hold": hold}
        return httpx.post(farm.base_url + "/fragile", json=body, headers={"X-Priority": "low"}, timeout=60)

    answer = pool.submit(post)
    wait_for(lambda: len(ran(store, tag)) == 1, WAIT_S, "the request did not start")
    os.kill(int(store.lindex(pids_key(tag), 0)), signal.SIGKILL)
    response = answer.result(timeout=WAIT_S * 2)
    store.delete(hold)
    assert response.json()["error"] == DeadLetterError.__name__
    assert "was delivered once and its replica died" in response.json()["message"], response.text
    letters = [fields for _id, fields in store.xrange(KEYS.dead_letters("fragile"))]
    ours = [f for f in letters if tag.encode() in f[b"body"]]
    assert len(ours) == 1 and ours[0][b"priority"] == b"low"
