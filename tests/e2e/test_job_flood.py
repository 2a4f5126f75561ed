"""An anonymous flood of asynchronous jobs, and a Redis that is full (issue 26, item 5).

- A flood of ``Prefer: respond-async`` POSTs at a slow deployment gets ``max_queued_jobs`` 202s and 503s with
  Retry-After for the rest, at once; another deployment still answers; no process of the farm dies; `up` again on
  the same data serves, and every accepted job is still there.
- A Redis that fills up while the farm runs refuses writes: callers get 503 saying so, reads still answer, the
  scheduler says so once (not every tick), and no process dies or is replaced; once Redis has room, it all serves.
- A farm started on a Redis that is already full comes up, says why it refuses, serves what needs no memory, and
  serves the rest once Redis has room.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from rq import Queue

from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.transport.connections import redacted
from streamserve.wire.keys import Keys
from tests.harness.farm import FAST_HEARTBEATS, Farm, farm_on
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

BOUND = 40
CONFIG = f"""
deployments:
  - name: echo
    import_path: examples.echo:Echo
    graceful_shutdown_timeout_s: 1
  - name: slow
    import_path: examples.sleepy:Sleepy
    init_kwargs: {{seconds: 60}}
    request_timeout_s: 120
    max_queued_requests: 50
    max_queued_jobs: {BOUND}
    graceful_shutdown_timeout_s: 1
"""
MAXMEMORY = "24mb"
ASYNC = {"Prefer": "respond-async"}
FLOOD = 2000
BEAT_TIMEOUT_S = float(FAST_HEARTBEATS["STREAMSERVE_HEARTBEAT_TIMEOUT_S"])
REFUSED_FOR_MEMORY = "Redis refuses writes, it is out of memory"
KEYS = Keys()


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    farm = farm_on(CONFIG, tmp_path)
    farm.extra_args = ["--redis-maxmemory", MAXMEMORY]
    try:
        yield farm
    finally:
        farm.stop()


@pytest.fixture
def admin(farm: Farm) -> Iterator[redis.Redis]:
    """A connection to the farm's Redis (it answers once the farm has started it)."""
    connection = redis.Redis.from_url(farm.effective_redis_url, socket_timeout=5)
    try:
        yield connection
    finally:
        connection.close()


def start_serving(farm: Farm) -> None:
    farm.start()
    wait_for(lambda: all(d["running"] == d["target"] for d in farm.status().values()), 60, "replicas not up")


async def flood(base_url: str) -> tuple[collections.Counter[tuple[int, str, str]], list[str], list[int]]:
    """FLOOD async POSTs at /slow, 50 at a time, with a POST to /echo among every 100: (status, Retry-After,
    error) -> count for /slow, the job ids accepted, and the statuses /echo answered."""
    answers: collections.Counter[tuple[int, str, str]] = collections.Counter()
    accepted: list[str] = []
    echoes: list[int] = []
    gate = asyncio.Semaphore(50)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:

        async def post(i: int) -> None:
            async with gate:
                if i % 100 == 0:
                    echoes.append((await http.post("/echo", json={"i": i})).status_code)
                response = await http.post("/slow", json={"i": i}, headers=ASYNC)
                body = response.json()
                if response.status_code == 202:
                    accepted.append(body["job_id"])
                    answers[(202, "", "")] += 1
                else:
                    refusal = (body["error"], "max_queued_jobs" in body["message"])
                    answers[(response.status_code, response.headers.get("retry-after", ""), str(refusal))] += 1

        await asyncio.gather(*(post(i) for i in range(FLOOD)))
    return answers, accepted, echoes


def jobs_not_ended(admin: redis.Redis) -> int:
    """Jobs RQ holds queued or running."""
    queue = Queue(KEYS.jobs_queue(), connection=admin)
    return int(admin.llen(queue.key)) + queue.started_job_registry.count


def farm_processes(farm: Farm) -> dict[str, list[int]]:
    return {role: sorted(pids) for role, pids in farm.role_pids().items()}


def test_a_flood_of_jobs_is_bounded_and_the_farm_lives_on_and_comes_back(farm: Farm, admin: redis.Redis) -> None:
    start_serving(farm)
    before = farm_processes(farm)
    assert {"scheduler", "gateway", "worker", "job-worker", "redis-server"} <= before.keys(), before

    answers, accepted, echoes = asyncio.run(flood(farm.base_url))

    refusal = (503, "1", str(("OverloadedError", True)))
    assert answers == {(202, "", ""): BOUND, refusal: FLOOD - BOUND}, answers
    assert set(echoes) == {200}, echoes
    assert admin.zcard(KEYS.accepted_jobs("slow")) == BOUND
    assert jobs_not_ended(admin) == BOUND  # nothing queued for the refused ones
    assert farm_processes(farm) == before  # none died, none was started again
    assert b"exited with code" not in farm.log()

    assert farm.stop() == 0
    start_serving(farm)  # `up` again, on the same data
    assert farm.post("/echo", {"again": 1}).status_code == 200
    statuses = {httpx.get(f"{farm.base_url}/-/jobs/{job_id}", timeout=10).json().get("status") for job_id in accepted}
    assert statuses <= {"queued", "started", "failed"}, statuses  # every accepted job is still there


def test_a_redis_that_fills_up_kills_no_process_and_the_farm_serves_again(farm: Farm, admin: redis.Redis) -> None:
    start_serving(farm)
    earlier = farm.post("/echo", {"n": 1}, headers=ASYNC).json()["job_id"]
    wait_for(lambda: job_status(farm, earlier) == "finished", 30, "the first job did not finish")
    before = farm_processes(farm)
    full_from = len(farm.log())
    admin.config_set("maxmemory", 1)
    try:
        call = farm.post("/echo", {"n": 2})
        assert call.status_code == 503 and call.headers["retry-after"] == "1", call.text
        assert call.json()["error"] == "OverloadedError" and "out of memory" in call.json()["message"], call.text
        job = farm.post("/echo", {"n": 3}, headers=ASYNC)
        assert job.status_code == 503 and "out of memory" in job.json()["message"], job.text
        # What needs no memory is still served.
        assert httpx.get(f"{farm.base_url}/-/healthz", timeout=10).status_code == 200
        assert job_status(farm, earlier) == "finished"
        wait_for(lambda: REFUSED_FOR_MEMORY.encode() in farm.log()[full_from:], 10, "the scheduler did not say so")
        # A job worker that dies now is started again, and the new one, which Redis will not let register, waits.
        victim = before["job-worker"][0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(new_job_workers(farm, before)) == 1, 10, "the job worker was not started again")
        (newcomer,) = new_job_workers(farm, before)
        waiting = f"job worker {newcomer}: {REFUSED_FOR_MEMORY}".encode()
        wait_for(lambda: waiting in farm.log()[full_from:], 10, "the new job worker did not say why it waits")
        # Full for longer than the heartbeat timeout: no heartbeat landed, and still no replica may be written off.
        beats = admin.zrange(KEYS.heartbeat_times("echo"), 0, -1, withscores=True)
        last_beat_ms = max(ts for _, ts in beats)
        wait_for(lambda: redis_time_ms(admin) - last_beat_ms > 1000 * (BEAT_TIMEOUT_S + 1), 10, "Redis was not full")
    finally:
        admin.config_set("maxmemory", MAXMEMORY)
    wait_for(lambda: farm.post("/echo", {"n": 4}).status_code == 200, 20, "the farm did not serve again")
    again = farm.post("/echo", {"n": 5}, headers=ASYNC).json()["job_id"]
    wait_for(lambda: job_status(farm, again) == "finished", 30, "a job after the episode did not finish")
    after = farm_processes(farm)
    assert after.pop("job-worker") == sorted([*before.pop("job-worker")[1:], newcomer])
    assert after == before  # no other process died, no replica was replaced
    told = farm.log()[full_from:].decode(errors="replace")
    scheduler_lines = [line for line in told.splitlines() if REFUSED_FOR_MEMORY in line and "scheduler" in line]
    assert len(scheduler_lines) == 1, scheduler_lines  # once for the episode, not once a tick
    exits = [line for line in told.splitlines() if "exited with code" in line and f"pid {victim}" not in line]
    assert exits == [] and "is dead" not in told, told[-3000:]


def new_job_workers(farm: Farm, before: dict[str, list[int]]) -> list[int]:
    return [pid for pid in farm.role_pids().get("job-worker", []) if pid not in before["job-worker"]]


def test_a_farm_started_on_a_full_redis_comes_up_says_why_and_serves_once_it_has_room(
    farm: Farm, admin: redis.Redis, tmp_path: Path
) -> None:
    start_serving(farm)
    kept = [farm.post("/slow", {"n": n}, headers=ASYNC).json()["job_id"] for n in range(3)]
    assert farm.stop() == 0
    assert farm.redis_port is not None
    with EmbeddedRedis(port=farm.redis_port, maxmemory="256mb", data_dir=farm.data_dir) as server:
        filler = redis.Redis.from_url(server.url)
        for n in range(32):  # 32 MB, more than the farm's maxmemory
            filler.set(f"filler:{n}", b"x" * 2**20)
        filler.close()

    farm.config.write_text(CONFIG.replace(f"max_queued_jobs: {BOUND}", f"max_queued_jobs: {BOUND + 1}"))
    farm.start()  # on the full Redis, with a config it cannot write
    log = farm.log().decode(errors="replace")
    assert f"warning: Redis at {redacted(farm.effective_redis_url)} is out of memory" in log, log[-3000:]
    assert f"{farm.config} was not applied, the farm runs what Redis holds" in log, log[-3000:]
    assert "NOT RUNNING: Redis is out of memory" in log, log[-3000:]  # the banner came at once, saying why
    call = farm.post("/echo", {"n": 1})
    assert call.status_code == 503 and "out of memory" in call.json()["message"], call.text
    assert call.headers["retry-after"] == "1"
    assert httpx.get(f"{farm.base_url}/-/healthz", timeout=10).status_code == 200
    assert {job_status(farm, job_id) for job_id in kept} <= {"queued", "failed"}  # read from the full Redis
    wait_for(lambda: b"standing by until Redis has room" in farm.log(), 10, "the scheduler did not say why it waits")
    up_processes = farm_processes(farm)
    assert {"scheduler", "gateway", "redis-server"} <= up_processes.keys(), up_processes

    admin.config_set("maxmemory", "64mb")  # room, as the warning advises
    wait_for(lambda: farm.post("/echo", {"n": 2}).status_code == 200, 30, lambda: str(farm.fail("not served")))
    assert {role: pids for role, pids in farm_processes(farm).items() if role in up_processes} == up_processes
    assert "exited with code" not in farm.log().decode(errors="replace")


def job_status(farm: Farm, job_id: str) -> Any:
    return httpx.get(f"{farm.base_url}/-/jobs/{job_id}", timeout=10).json().get("status")


def redis_time_ms(admin: redis.Redis) -> float:
    seconds, micros = admin.time()
    return seconds * 1000 + micros / 1000
