"""The scheduler answers SIGTERM within a second whatever its tick is doing: a long tick over a large farm is cut
short and the stop is graceful; a tick that never gives its event loop back, or a stop that hangs and a second
signal, end the process at once (issue 27, defect 4: it ignored SIGINT and SIGTERM and needed kill -9)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.keys import Keys
from streamserve.wire.limits import DEFAULT_LIMITS
from tests.harness.farm import Processes
from tests.harness.paths import ROOT, python_path
from tests.harness.waiting import wait_for

# From SIGTERM to the process gone: the second it has to answer, and room for a loaded test machine (the suite runs
# farms on the other xdist worker meanwhile).
EXIT_WITHIN_S = 5.0
# Deployments of the largest legal size: a first tick that records their replicas one by one takes many seconds.
DEPLOYMENTS = 40


def start(processes: Processes, mode: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"scheduler-{mode}.log"
    env = {**processes.env(), "PYTHONPATH": python_path(), "STREAMSERVE_JOB_WORKERS": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [".venv/bin/python", "-m", "tests.integration.signalled_scheduler", mode],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    processes.started[f"scheduler-{mode}"] = proc  # killed at the end by the fixture, whatever happens
    return proc, log


def ticking(proc: subprocess.Popen[bytes], log: Path) -> bool:
    assert proc.poll() is None, log.read_text()
    return b"tick\n" in log.read_bytes()


def seconds_to_exit(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> float:
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the scheduler was still running {EXIT_WITHIN_S} s after {signal.Signals(sig).name}")
    return time.monotonic() - sent


def test_a_long_tick_over_a_large_farm_is_cut_short_and_the_stop_is_graceful(
    processes: Processes, redis_url: str, tmp_path: Path
) -> None:
    keys = Keys()
    size = DEFAULT_LIMITS.num_replicas
    names = [f"big{i:02d}" for i in range(DEPLOYMENTS)]
    configs = [
        DeploymentConfig.model_validate({"name": n, "import_path": "examples.functions:add", "num_replicas": size})
        for n in names
    ]
    client = redis.Redis.from_url(redis_url)
    try:
        # Written as DesiredState would (its records), but in one pipeline: the test's setup need not be slow.
        client.hset(keys.deployments(), mapping={c.name: c.to_json() for c in configs})
        assert AppConfig(deployments=configs)  # legal: every count within the defaults
        proc, log = start(processes, "farm", tmp_path)

        def recording() -> bool:
            return ticking(proc, log) and client.hlen(keys.replicas(names[0])) > 0

        wait_for(recording, 60, lambda: f"the first tick never began:\n{log.read_text()}")
        seconds_to_exit(proc, signal.SIGTERM)
        assert proc.returncode == 0, log.read_text()  # graceful
        output = log.read_text()
        assert "SIGTERM: stopping" in output and "cut short to stop" in output, output
        recorded = sum(client.hlen(keys.replicas(n)) for n in names)
        assert recorded < DEPLOYMENTS * size, "the tick was not cut short: every replica was recorded"
        # Between two replicas of one deployment, too (one of 1,024 replicas takes seconds on a loaded host).
        assert client.hlen(keys.replicas(names[0])) < size, "the first deployment's replicas were all recorded"
        assert client.get(keys.scheduler_lock()) is None  # the lock was released on the way out
    finally:
        client.close()


def test_a_tick_that_never_gives_the_loop_back_still_answers_within_a_second(
    processes: Processes, tmp_path: Path
) -> None:
    proc, log = start(processes, "stuck", tmp_path)
    wait_for(lambda: ticking(proc, log), 60, lambda: f"the scheduler never ticked:\n{log.read_text()}")
    took = seconds_to_exit(proc, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, log.read_text()
    assert "the event loop has been busy for 1 s without taking the stop request" in log.read_text()
    assert took >= 1.0  # it gave the loop its second first


def test_a_second_signal_ends_a_stop_that_hangs(processes: Processes, tmp_path: Path) -> None:
    proc, log = start(processes, "slow-stop", tmp_path)
    wait_for(lambda: ticking(proc, log), 60, lambda: f"the scheduler never ticked:\n{log.read_text()}")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: b"SIGINT: stopping" in log.read_bytes(), 10, lambda: f"no answer to SIGINT:\n{log.read_text()}")
    assert proc.poll() is None  # the graceful stop runs (and hangs)
    seconds_to_exit(proc, signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT, log.read_text()
    assert "SIGINT again: exiting at once" in log.read_text()
