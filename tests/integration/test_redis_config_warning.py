"""Every process warns once at start when its Redis may lose the farm's work; the processes it starts do not repeat it.

Each test runs its own redis-server: the session's test server keeps nothing (no AOF) on purpose.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamserve.runtime.embedded_redis import redis_server_binary
from streamserve.runtime.processes import free_port, stop_group
from streamserve.transport.redis_checks import redis_problems
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for

WARNING = "may lose the farm's work"


def start_redis(tmp_path: Path, *options: str) -> Iterator[str]:
    """A redis-server on a free loopback port with ``options``; yields its URL and stops it by id afterwards."""
    port = free_port()
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), *options],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = redis.Redis(port=port, socket_connect_timeout=0.5)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        wait_for(answers, 10, "redis-server did not start")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        stop_group(proc, timeout_s=5)


@pytest.fixture
def lossy_redis(tmp_path: Path) -> Iterator[str]:
    """Keeps nothing across a restart and evicts when full: what Redis does when left to its defaults."""
    yield from start_redis(tmp_path, "--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru")


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[str]:
    """AOF on and noeviction, as `up`'s embedded Redis and the compose stack run it."""
    yield from start_redis(tmp_path, "--save", "", "--appendonly", "yes", "--maxmemory-policy", "noeviction")


@pytest.fixture
def farm_processes(tmp_path: Path) -> Iterator[list[Processes]]:
    """Processes against the test's own Redis: append one; everything each started is killed at the end."""
    made: list[Processes] = []
    try:
        yield made
    finally:
        for procs in made:
            procs.stop_all()


def run_gateway_until_healthy(procs: Processes) -> str:
    """Start a gateway, wait until it answers /-/healthz, stop it; its whole output."""
    gateway = procs.start_gateway(ready_path="/-/healthz")
    procs.stop_all()
    return gateway.log.read_text()


def test_a_gateway_on_a_lossy_redis_warns_once_with_both_problems(
    lossy_redis: str, tmp_path: Path, farm_processes: list[Processes]
) -> None:
    farm_processes.append(procs := Processes(lossy_redis, tmp_path))
    output = run_gateway_until_healthy(procs)
    assert output.count(WARNING) == 1, output
    assert "WARNING" in output and "persistence is off" in output and "maxmemory-policy is allkeys-lru" in output
    assert "\\n" not in output, output  # each line of it a line of the log, not one line with escapes


def test_the_job_workers_a_scheduler_starts_do_not_repeat_its_warning(
    lossy_redis: str, tmp_path: Path, farm_processes: list[Processes]
) -> None:
    farm_processes.append(procs := Processes(lossy_redis, tmp_path))
    procs.spawn("scheduler", "scheduler")  # its 2 job workers write to the same output

    def job_workers_serving() -> bool:
        return procs.log("scheduler").read_text().count("serving queue") >= 2

    wait_for(job_workers_serving, 30, "the scheduler's job workers did not start")
    procs.stop_all()
    output = procs.log("scheduler").read_text()
    assert output.count(WARNING) == 1, output


def test_up_warns_once_for_all_the_processes_it_starts(
    lossy_redis: str, tmp_path: Path, farm_processes: list[Processes]
) -> None:
    farm_processes.append(procs := Processes(lossy_redis, tmp_path))
    config = tmp_path / "empty.yaml"
    config.write_text("deployments: []\n")
    procs.spawn("up", "up", str(config), "--port", str(free_port()))  # REDIS_URL: the lossy one

    def job_workers_serving() -> bool:  # started by up's scheduler, after its gateway
        return procs.log("up").read_text().count("serving queue") >= 2

    wait_for(job_workers_serving, 30, "up's farm did not start")
    procs.stop_all()
    output = procs.log("up").read_text()
    assert output.count(WARNING) == 1 and "warning: Redis at" in output, output


def test_a_durable_redis_gets_no_warning(durable_redis: str, tmp_path: Path, farm_processes: list[Processes]) -> None:
    farm_processes.append(procs := Processes(durable_redis, tmp_path))
    output = run_gateway_until_healthy(procs)
    assert WARNING not in output and "Redis at" not in output, output


def test_what_cannot_be_read_is_not_warned_about(lossy_redis: str) -> None:
    """A user without CONFIG (as on managed Redis) cannot see the save points: only the eviction is certain."""
    admin = redis.Redis.from_url(lossy_redis)
    try:
        admin.acl_setuser("probe", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"])
    finally:
        admin.close()
    (line,) = redis_problems(lossy_redis.replace("redis://", "redis://probe:pw@"))
    assert "maxmemory-policy is allkeys-lru" in line


def test_an_unreachable_redis_gets_no_warning() -> None:
    assert redis_problems(f"redis://127.0.0.1:{free_port()}/0") == []
