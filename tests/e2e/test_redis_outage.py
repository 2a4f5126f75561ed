"""A persistent redis-server killed with -9 under load and started again on the same port and data: callers waiting
on the gateway get 503 within seconds (not their 60 s deadline), nothing is lost or run twice for a caller that got
an answer, and the farm serves again within 10 s without restarting any of its processes. Killed under an idle farm:
the first request after it gets its 503 as soon as the later ones do."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from streamserve import Client
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.wire.errors import RedisUnavailableError
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from tests.harness.farm import Processes, running_farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - name: lines
    import_path: tests.deployments:append_line
    num_replicas: 2
    max_ongoing_requests: 4
"""
ECHO = """
deployments:
  - name: echo
    import_path: examples.echo:Echo
    num_replicas: 1
    route_prefix: /echo
"""
# docs/operations.md promises new callers a 503 within about 2 s over HTTP, 1.5 s from the client, once Redis dies.
FIRST_503_S = 3.0
HELD = 4  # requests a replica holds (waiting for a file) while Redis dies: their callers are in flight
OUTAGE_S = 5.0  # longer than the reply reader's grace (REPLY_OUTAGE_FAIL_S), so waiting callers are failed
LOAD_THREADS = 4


@dataclass(frozen=True)
class Answer:
    line: str
    sent_at: float
    status: int  # 0: no HTTP answer at all
    error: str = ""


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(port=free_port(), data_dir=tmp_path / "data", tie_to_parent=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def post(client: httpx.Client, url: str, body: dict[str, str], timeout_s: float) -> tuple[int, str]:
    try:
        response = client.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError:
        return 0, "no answer"
    error = "" if response.status_code == 200 else orjson.loads(response.content).get("error", "?")
    return response.status_code, error


def test_a_redis_restart_under_load_loses_nothing_and_runs_nothing_twice(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    out, hold = tmp_path / "out.txt", tmp_path / "hold"
    processes = Processes(redis_server.url, tmp_path)
    try:
        processes.spawn("scheduler", "scheduler")
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG)
        processes.run("deploy", str(config), "--wait")
        url = processes.start_gateway().url
        pids_before = {name: proc.pid for name, proc in processes.started.items()}
        answers: list[Answer] = []
        stop = threading.Event()
        counter = itertools.count()

        def load() -> None:
            with httpx.Client() as client:
                while not stop.is_set():
                    line = f"load-{next(counter)}"
                    sent_at = time.monotonic()
                    status, error = post(client, f"{url}/lines", {"path": str(out), "line": line}, timeout_s=30)
                    answers.append(Answer(line, sent_at, status, error))

        with ThreadPoolExecutor(LOAD_THREADS + HELD) as pool, httpx.Client() as held_client:
            try:
                # Held: in flight on the replicas (60 s deadline) when Redis dies.
                held: list[Future[tuple[int, str]]] = [
                    pool.submit(
                        post, held_client, f"{url}/lines",
                        {"path": str(out), "line": f"held-{i}", "wait_for": str(hold)}, 40,
                    )
                    for i in range(HELD)
                ]  # fmt: skip
                wait_for(lambda: _running(redis_server) >= HELD, 20, "the held requests did not reach the replicas")
                loaders = [pool.submit(load) for _ in range(LOAD_THREADS)]
                wait_for(lambda: sum(a.status == 200 for a in answers) >= 50, 30, "the load was not served")

                assert redis_server.proc is not None
                redis_server.proc.kill()
                redis_server.proc.wait(5)
                killed_at = time.monotonic()
                # The held callers are answered 503 within a few seconds, while Redis is still away.
                held_answers = [f.result(timeout=OUTAGE_S + 10) for f in held]
                assert held_answers == [(503, "RedisUnavailableError")] * HELD
                assert time.monotonic() - killed_at < OUTAGE_S + 10

                # Released now, the held requests run while Redis is away: their replies and acknowledgements
                # must go out once it is back (left pending, they would be run again when the replica goes).
                hold.touch()
                held_lines = {f"held-{i}" for i in range(HELD)}
                wait_for(lambda: held_lines <= set(out.read_text().split()), 10, "the held requests did not run")
                wait_for(lambda: time.monotonic() - killed_at >= OUTAGE_S, OUTAGE_S + 1, "")
                redis_server.start()
                back_at = time.monotonic()
                # The farm serves again within 10 s of Redis coming back.
                wait_for(
                    lambda: any(a.status == 200 and a.sent_at > back_at for a in answers),
                    10,
                    "no request sent after Redis came back was served within 10 s",
                )
                wait_for(lambda: sum(a.status == 200 and a.sent_at > back_at for a in answers) >= 50, 30, "slow")
                stop.set()
                for loader in loaders:
                    loader.result(timeout=40)

            finally:
                stop.set()  # the load and held threads end (bounded) whatever happened
                hold.touch()
        assert httpx.get(f"{url}/-/healthz", timeout=5).status_code == 200
        # Every request that was accepted and not answered 200 is run at most once; every 200 exactly once.
        wait_for(lambda: _running(redis_server) == 0, 20, "the replicas did not finish what they held")
        executions = Counter(out.read_text().split())
        ok = [a.line for a in answers if a.status == 200]
        failed = {a.line: (a.status, a.error) for a in answers if a.status != 200}
        assert all(executions[line] == 1 for line in ok), {
            line: executions[line] for line in ok if executions[line] != 1
        }
        assert all(executions[line] <= 1 for line in failed), {
            line: failed[line] for line in failed if executions[line] > 1
        }
        assert all(executions[f"held-{i}"] == 1 for i in range(HELD))
        assert set(failed.values()) <= {(503, "RedisUnavailableError"), (503, "UnavailableError")}, failed
        assert set(executions) <= {a.line for a in answers} | {f"held-{i}" for i in range(HELD)}
        # No process was restarted, no replica duplicated.
        assert {name: proc.pid for name, proc in processes.started.items()} == pids_before
        assert all(proc.poll() is None for proc in processes.started.values())
        # The scheduler kept leading across the outage (its lock expired meanwhile; nobody else took it).
        assert "lost leadership" not in processes.log("scheduler").read_text()
        [deployment] = orjson.loads(processes.run("status", "--json").stdout)["deployments"]
        assert deployment["running"] == 2, deployment
    finally:
        processes.stop_all()


def test_the_first_request_after_redis_dies_under_an_idle_farm_gets_its_503_within_seconds(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(ECHO)
    with running_farm(config, tmp_path, redis_url=redis_server.url) as farm, Client(redis_server.url) as client:
        # Served once, then idle: the gateway and the client each keep a connection to Redis that is about to die.
        assert farm.post("/echo", {"x": 1}).status_code == 200
        assert client.call("echo", {"x": 1}, timeout=10)["echo"] == {"x": 1}
        assert redis_server.proc is not None
        redis_server.proc.kill()
        redis_server.proc.wait(5)
        try:
            started = time.monotonic()
            response = farm.post("/echo", {"x": 2})
            http_s = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(RedisUnavailableError):
                client.call("echo", {"x": 2}, timeout=30)
            call_s = time.monotonic() - started
            assert (response.status_code, response.json()["error"]) == (503, "RedisUnavailableError")
            waited = {"gateway": round(http_s, 1), "client": round(call_s, 1)}
            assert max(waited.values()) < FIRST_503_S, f"the first call after Redis died waited (s): {waited}"
        finally:
            redis_server.start()  # back, so that the farm stops at once


def _running(server: EmbeddedRedis) -> int:
    """Requests delivered to a replica and not yet acknowledged (the consumer group's pending count)."""
    client = redis.Redis.from_url(server.url, socket_timeout=1)
    try:
        groups = client.xinfo_groups(Keys().requests("lines"))
        return sum(int(g["pending"]) for g in groups if g["name"].decode() == CONSUMER_GROUP)
    except redis.RedisError:
        return -1
    finally:
        client.close()


FAST_BEATS = {"STREAMSERVE_HEARTBEAT_INTERVAL_S": "0.2", "STREAMSERVE_HEARTBEAT_TIMEOUT_S": "2"}
PAUSE_S = 4.0  # twice the heartbeat timeout


def test_a_redis_that_hangs_past_the_heartbeat_timeout_costs_no_replica_and_runs_nothing_twice(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """A Redis that stops answering without dying (a slow command, a fork or fsync stall, a paused VM: here SIGSTOP)
    holds every replica's heartbeat as it holds the scheduler's reads. When it answers again, the scheduler took
    every replica for dead, killed them all and ran what they held a second time."""
    out, hold = tmp_path / "out.txt", tmp_path / "hold"
    processes = Processes(redis_server.url, tmp_path, extra_env=FAST_BEATS)
    store = redis.Redis.from_url(redis_server.url)
    try:
        processes.spawn("scheduler", "scheduler")
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG)
        processes.run("deploy", str(config), "--wait")
        replicas = set(store.hkeys(Keys().replicas("lines")))
        with Client(redis_server.url) as client:
            held = [
                client.submit("lines", {"path": str(out), "line": f"held-{i}", "wait_for": str(hold)}, timeout=60)
                for i in range(HELD)
            ]
            wait_for(lambda: _running(redis_server) >= HELD, 20, "the held requests did not reach the replicas")
            assert redis_server.proc is not None
            redis_server.proc.send_signal(signal.SIGSTOP)
            try:
                paused_at = time.monotonic()
                wait_for(lambda: time.monotonic() - paused_at >= PAUSE_S, PAUSE_S + 1, "")
            finally:
                redis_server.proc.send_signal(signal.SIGCONT)
            scheduler_log = processes.log("scheduler")
            wait_for(lambda: "stalled" in scheduler_log.read_text(), 10, lambda: scheduler_log.read_text()[-2000:])
            hold.touch()
            assert [future.result(timeout=30) for future in held] == [f"held-{i}" for i in range(HELD)]
        assert "is dead" not in scheduler_log.read_text(), scheduler_log.read_text()[-3000:]
        assert set(store.hkeys(Keys().replicas("lines"))) == replicas
        assert Counter(out.read_text().split()) == {f"held-{i}": 1 for i in range(HELD)}
    finally:
        hold.touch()
        store.close()
        processes.stop_all()
