"""No process of a farm outlives its `streamserve up`: not after kill -9 of `up` (reaped or not, at any moment), a
closed terminal (SIGHUP), a service manager's stop (SIGTERM), nor a Ctrl-C after the embedded Redis died first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.lifeline import FARM_GONE_DRAIN_S, FARM_GONE_WIND_DOWN_S
from streamserve.runtime.processes import free_port, port_is_free, process_state
from streamserve.transport.connections import sync_redis
from tests.harness.farm import Farm, farm_on, pids_with_marker
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - {name: echo, import_path: 'examples.echo:Echo', num_replicas: 2}
"""


@pytest.fixture
def farm(tmp_path: Path) -> Farm:
    return farm_on(CONFIG, tmp_path)


def replicas(farm: Farm) -> list[int]:
    return farm.role_pids().get("worker", [])


SLOW_START = """
deployments:
  - {name: echo, import_path: 'examples.echo:Echo', num_replicas: 2}
  - {name: slow, import_path: 'tests.deployments:SlowStart', init_kwargs: {seconds: 2}, num_replicas: 1}
  - {name: sleepy, import_path: 'examples.sleepy:Sleepy', num_replicas: 1}
"""
# "with-a-job-running" is after the banner too: a job worker runs a 60 s call, and the replica serving it holds it.
MOMENTS = ("before-the-banner", "with-a-job-running", "under-traffic")
ROUNDS = 1  # x 3 moments for each Redis (each kill ~15 s of the farm worker: the CI run keeps to 30 min)


@pytest.fixture(scope="module")
def external_redis() -> Iterator[EmbeddedRedis]:
    """A Redis the farms do not own (it outlives each `up`), flushed between farms."""
    server = EmbeddedRedis(port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def farm_of_one(tmp_path: Path, name: str, import_path: str) -> Farm:
    """A farm (not started) of one deployment, ``name``, serving ``import_path``."""
    config = tmp_path / "farm.yaml"
    config.write_text(f"deployments:\n  - {{name: {name}, import_path: '{import_path}'}}\n")
    return Farm(config, tmp_path / "up.log")


def kill_9(farm: Farm) -> None:
    """Kill the farm's `up` with -9, and reap it."""
    assert farm.proc is not None
    os.kill(farm.proc.pid, signal.SIGKILL)
    farm.proc.wait()


def kill_up_at(farm: Farm, moment: str) -> subprocess.Popen[bytes]:
    """Launch `up` unreaped, as a program that supervises several things does, and kill -9 it at ``moment``."""
    proc = farm.launch()
    if moment == "before-the-banner":
        # The echo and sleepy replicas are up; the slow one is still in its constructor: the banner is not out yet.
        wait_for(lambda: len(replicas(farm)) == 4, 30, lambda: f"replicas did not start: {farm.processes()}")
        assert b"streamserve is up" not in farm.log()
    else:
        wait_for(lambda: b"streamserve is up" in farm.log(), 60, lambda: farm.fail("not up").args[0])
    if moment == "under-traffic":
        answered: list[int] = []
        with ThreadPoolExecutor(4) as pool:
            callers = [pool.submit(post_until_gone, farm, answered) for _ in range(4)]
            wait_for(lambda: len(answered) >= 40, 20, lambda: f"too few answers: {[c.exception() for c in callers]}")
            os.kill(proc.pid, signal.SIGKILL)
    else:
        if moment == "with-a-job-running":
            job_started(farm)
        os.kill(proc.pid, signal.SIGKILL)
    return proc


def exit_took_s(log: bytes, who: str, told: str) -> float:
    """From the line where ``who`` says ``told`` to its "exited" line, by the clock of its own log lines."""
    stamps = {}
    for line in log.decode().splitlines():
        for mark in (told, " exited "):
            if f"] {who}" in line and mark in line:
                stamps[mark] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return (stamps[" exited "] - stamps[told]).total_seconds()


def job_started(farm: Farm) -> None:
    """Queue a job of 60 s and wait until a job worker runs it."""
    queued = httpx.post(
        farm.base_url + "/sleepy", json={"seconds": 60}, headers={"Prefer": "respond-async"}, timeout=10
    )
    assert queued.status_code == 202, queued.text
    job = farm.base_url + "/-/jobs/" + queued.json()["job_id"]
    seen: list[str] = []

    def running() -> bool:
        seen.append(httpx.get(job, timeout=10).json()["status"])
        return seen[-1] == "started"

    wait_for(running, 30, lambda: farm.fail(f"the job never started: {seen[-3:]}").args[0])


def post_until_gone(farm: Farm, answered: list[int]) -> None:
    """POST to the gateway until it stops answering (at most 20 s, 127.0.0.1 only), noting each answer."""
    deadline = time.monotonic() + 20
    with httpx.Client(base_url=farm.base_url, timeout=2) as http:
        while time.monotonic() < deadline:
            try:
                answered.append(http.post("/echo", json={"n": len(answered)}).status_code)
            except httpx.HTTPError:
                return


@pytest.mark.parametrize("moment", [m for _ in range(ROUNDS) for m in MOMENTS])
@pytest.mark.parametrize("redis", ["embedded", "external"])
def test_kill_9_of_an_unreaped_up_leaves_nothing_within_15_s(
    tmp_path: Path, redis: str, moment: str, request: pytest.FixtureRequest
) -> None:
    """Whoever started `up` has not reaped it (it stays a zombie in /proc): its replicas and job workers still leave,
    at once (a job's call that runs is given FARM_GONE_DRAIN_S)."""
    config = tmp_path / "farm.yaml"
    config.write_text(SLOW_START)
    url = None
    if redis == "external":
        server: EmbeddedRedis = request.getfixturevalue("external_redis")
        sync_redis(server.url).flushall()
        url = server.url
    farm = Farm(config, tmp_path / "up.log", redis_url=url)
    try:
        proc = kill_up_at(farm, moment)
        wait_for(lambda: pids_with_marker(farm.token) == [], 15, lambda: f"left behind: {farm.processes()}")
        assert proc.poll() == -signal.SIGKILL  # reaped only now, by the test
        if moment == "with-a-job-running":
            # The replica that held the job's call drained for FARM_GONE_DRAIN_S, then tried each last write once;
            # the scheduler gave the job workers as long, and stopped no replica through a Redis gone with `up`.
            log, bound_s = farm.log(), FARM_GONE_DRAIN_S + FARM_GONE_WIND_DOWN_S + 1
            assert exit_took_s(log, "replica sleepy#", "is gone") <= bound_s, log
            assert exit_took_s(log, "scheduler", "SIGTERM: stopping") <= bound_s, log
        if farm.redis_port is not None:
            assert port_is_free("127.0.0.1", farm.redis_port)
    finally:
        farm.stop()


def test_a_daemon_a_replica_detached_is_ended_by_the_next_up_after_a_kill_9(tmp_path: Path) -> None:
    """A process that a handler detached from its replica's process group and session outlives `up` killed with -9
    (nothing can find it then but the mark every process of the farm carries): the next `up` from the same data
    directory ends it."""
    farm = farm_of_one(tmp_path, "daemons", "tests.deployments:start_daemon")
    try:
        farm.start()
        daemon = farm.post("/daemons", {}).json()
        assert daemon in pids_with_marker(farm.token)
        kill_9(farm)
        wait_for(lambda: pids_with_marker(farm.token) == [daemon], 15, lambda: f"left: {farm.processes()}")
        farm.start()
        wait_for(lambda: daemon not in pids_with_marker(farm.token), 10, "the next `up` left the daemon running")
        assert f"ended what the farm killed before left running here (pid {daemon})".encode() in farm.log()
    finally:
        farm.stop()
        for pid in pids_with_marker(farm.token):  # (the daemon, should the test fail: it is the test's to end)
            os.kill(pid, signal.SIGKILL)


def test_up_again_at_once_after_a_kill_9_serves_with_replicas_of_its_own(tmp_path: Path) -> None:
    """The killed farm's replica drains what it holds (FARM_GONE_DRAIN_S) before it leaves: an `up` started
    meanwhile adopted it as its own, and printed its banner with no replica that would stay (the first request then
    waited for a new one to start). Now it waits for the old one to leave first."""
    farm = farm_of_one(tmp_path, "sleepy", "examples.sleepy:Sleepy")
    try:
        farm.start()
        old = set(replicas(farm))
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(farm.post, "/sleepy", {"seconds": 20})
            wait_for(lambda: farm.status()["sleepy"]["in_flight"] == 1, 30, "the request did not start")
            kill_9(farm)
            farm.start()
            serving = {replica["pid"] for replica in farm.status()["sleepy"]["replicas"]}
            assert serving and not serving & old, (serving, old)
            assert b"waiting for the processes of the farm killed before to leave" in farm.log()
            assert farm.post("/sleepy", {"seconds": 0}).status_code == 200
            with contextlib.suppress(httpx.HTTPError):
                held.result(timeout=60)  # (cut with its farm)
    finally:
        farm.stop()


def test_up_again_after_a_kill_9_ends_the_redis_its_farm_left_stopped(tmp_path: Path) -> None:
    """A farm's embedded Redis stopped (SIGSTOP, a paused host) when its `up` was killed -9 stays, the SIGTERM it was
    sent waiting: the next `up` failed at once ("embedded redis-server exited at start (is port ... in use?)") and
    kept failing until someone woke it (found by an outside tester)."""
    farm = farm_of_one(tmp_path, "echo", "examples.echo:Echo")
    redis_pid: int | None = None
    try:
        farm.start()
        [redis_pid] = farm.role_pids()["redis-server"]
        os.kill(redis_pid, signal.SIGSTOP)
        kill_9(farm)
        farm.start()
        assert b"stopped the Redis the farm killed before left running here" in farm.log()
        assert not Path(f"/proc/{redis_pid}").exists() or process_state(redis_pid) in ("", "Z")
        assert farm.post("/echo", {"x": 1}).status_code == 200
    finally:
        if redis_pid is not None:  # (the stopped Redis, should the test fail before it is ended)
            with contextlib.suppress(ProcessLookupError):
                os.kill(redis_pid, signal.SIGKILL)
        farm.stop()


def test_ctrl_c_while_up_waits_for_a_killed_farms_processes_stops_it_at_once(tmp_path: Path) -> None:
    """That wait (up to the old replica's drain) came before `up` took its stop signals: a Ctrl-C then ended it with
    a KeyboardInterrupt traceback."""
    farm = farm_of_one(tmp_path, "sleepy", "examples.sleepy:Sleepy")
    try:
        farm.start()
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(farm.post, "/sleepy", {"seconds": 20})
            wait_for(lambda: farm.status()["sleepy"]["in_flight"] == 1, 30, "the request did not start")
            kill_9(farm)
            up = farm.launch()
            waiting = b"waiting for the processes of the farm killed before to leave"
            wait_for(lambda: waiting in farm.log() or up.poll() is not None, 30, lambda: farm.fail("no wait").args[0])
            up.send_signal(signal.SIGINT)
            assert up.wait(10) == 130, farm.log()
            assert b"Traceback" not in farm.log(), farm.log()
            with contextlib.suppress(httpx.HTTPError):
                held.result(timeout=60)  # (cut with its farm)
    finally:
        farm.stop()


def test_kill_9_of_up_leaves_no_worker_of_a_pool_that_starts_them_again(tmp_path: Path) -> None:
    """A multiprocessing pool's thread starts a new worker for each that dies: the replica that killed what its group
    held as it left (its farm gone) was still running that thread, and the new workers outlived it (for good: the
    next `up` takes them for the farm's own, by their command line)."""
    farm = farm_of_one(tmp_path, "pools", "tests.deployments:pool_workers")
    try:
        farm.start()
        workers = farm.post("/pools", {}).json()
        assert len(workers) == 2 and set(workers) <= set(pids_with_marker(farm.token))
        kill_9(farm)
        wait_for(lambda: pids_with_marker(farm.token) == [], 15, lambda: f"left behind: {farm.processes()}")
    finally:
        farm.stop()
        for pid in pids_with_marker(farm.token):  # (should the test fail: they are the test's to end)
            os.kill(pid, signal.SIGKILL)


def test_kill_9_of_up_and_its_scheduler_leaves_no_job_worker_running_its_job(
    tmp_path: Path, external_redis: EmbeddedRedis
) -> None:
    """With its scheduler killed too, nobody is left to end a job worker's drain: it ends it itself, within
    FARM_GONE_DRAIN_S and its wind-down, though its job has 60 s to go and its (external) Redis is still there."""
    config = tmp_path / "farm.yaml"
    config.write_text(SLOW_START)
    sync_redis(external_redis.url).flushall()
    farm = Farm(config, tmp_path / "up.log", redis_url=external_redis.url)
    try:
        proc = farm.launch()
        wait_for(lambda: b"streamserve is up" in farm.log(), 60, lambda: farm.fail("not up").args[0])
        job_started(farm)
        [scheduler] = farm.role_pids()["scheduler"]
        os.kill(scheduler, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        wait_for(lambda: pids_with_marker(farm.token) == [], 15, lambda: f"left behind: {farm.processes()}")
        assert b"is gone; stopping" in farm.log()  # the job worker's own words: it left by itself
    finally:
        farm.stop()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_hangup_and_terminate_stop_the_farm_like_ctrl_c(farm: Farm, sig: signal.Signals) -> None:
    farm.start()
    try:
        assert farm.proc is not None
        farm.proc.send_signal(sig)
        assert farm.proc.wait(40) == 0
        assert f"streamserve: {sig.name}, stopping" in farm.log().decode()
        assert pids_with_marker(farm.token) == []
    finally:
        farm.stop()


def test_ctrl_c_after_redis_died_leaves_no_replica(farm: Farm) -> None:
    farm.start()
    try:
        assert len(replicas(farm)) == 2 and farm.proc is not None
        [redis_pid] = farm.role_pids()["redis-server"]
        os.kill(redis_pid, signal.SIGKILL)
        farm.proc.send_signal(signal.SIGINT)
        farm.proc.wait(60)
        assert pids_with_marker(farm.token) == [], farm.processes()
    finally:
        farm.stop()
