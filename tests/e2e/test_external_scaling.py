"""Externally scaled deployments, end to end: the scheduler starts nothing, and every `streamserve worker NAME`
that heartbeats is a replica: counted, judged, rolled by a deploy, and written off when it dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from streamserve.wire.keys import Keys
from tests.harness.farm import Processes
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

CONFIG = """
deployments:
  - name: ext
    import_path: tests.deployments:whoami
    external_scaler_enabled: true
    max_queued_requests: 3
    graceful_shutdown_timeout_s: 5
    version: "{version}"
"""


def write_config(path: Path, version: str) -> Path:
    path.write_text(CONFIG.format(version=version))
    return path


def status(processes: Processes) -> dict[str, Any]:
    [deployment] = orjson.loads(processes.run("status", "--json").stdout)["deployments"]
    return dict(deployment)


def streamserve(processes: Processes, *args: str) -> subprocess.CompletedProcess[str]:
    """A CLI command whose failure the test looks at (Processes.run insists on success)."""
    return subprocess.run(
        [STREAMSERVE, *args], cwd=ROOT, env=processes.env(), capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def gateway(processes: Processes) -> str:
    return processes.start_gateway().url


def test_workers_started_by_hand_are_the_replicas(processes: Processes, gateway: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "ext.yaml", "1")
    processes.spawn("scheduler", "scheduler")
    processes.run("deploy", str(config))

    # No worker yet: a request queues (no instant 503), and the first worker to come serves it.
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(httpx.post, f"{gateway}/ext", json="first", timeout=30)
        wait_for(lambda: status(processes)["queued"] == 1, 20, "the request did not queue")
        assert not waiting.done()
        first = processes.spawn("worker-1", "worker", "ext")
        reply = waiting.result(timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"host": socket.gethostname(), "pid": first.pid, "gpus": None, "body": "first"}

    # Counted in status, with its host and version; the text table says who scales it.
    wait_for(lambda: status(processes)["running"] == 1, 20, "the worker was not counted")
    s = status(processes)
    [replica] = s["replicas"]
    assert (replica["host"], replica["pid"], replica["version"]) == (socket.gethostname(), first.pid, s["version"])
    assert (s["target"], s["health"], s["external_scaler_enabled"]) == (1, "HEALTHY", True)
    table = processes.run("status").stdout
    assert "1 (external)" in table and replica["replica_id"] in table

    # Its count is not ours to set.
    refused = streamserve(processes, "scale", "ext", "3")
    assert refused.returncode == 1 and "scaled externally" in refused.stderr, refused.stderr

    # A second worker joins; a new version is DONE once both run it (each starts again on it, same process).
    second = processes.spawn("worker-2", "worker", "ext")
    wait_for(lambda: status(processes)["running"] == 2, 20, "the second worker was not counted")
    old_ids = {r["replica_id"] for r in status(processes)["replicas"]}
    deployed = processes.run("deploy", str(write_config(config, "2")), "--wait", "--timeout", "60")
    assert "ext: done" in deployed.stdout, deployed.stdout
    s = status(processes)
    assert s["running"] == 2 and {r["version"] for r in s["replicas"]} == {s["version"]}, s
    assert {r["pid"] for r in s["replicas"]} == {first.pid, second.pid}  # the same processes, on the new code
    assert old_ids.isdisjoint(r["replica_id"] for r in s["replicas"])
    assert all(httpx.post(f"{gateway}/ext", json=i, timeout=10).status_code == 200 for i in range(4))

    # SIGTERM: the worker drains, says goodbye and leaves status at once (no heartbeat expiry needed).
    first.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0
    wait_for(lambda: status(processes)["running"] == 1, 10, "the stopped worker stayed in status")


def test_a_dead_workers_requests_are_served_by_another(processes: Processes, gateway: str, tmp_path: Path) -> None:
    processes.spawn("scheduler", "scheduler")
    processes.run("deploy", str(write_config(tmp_path / "ext.yaml", "1")))
    victim = processes.spawn("worker-victim", "worker", "ext")
    wait_for(lambda: status(processes)["running"] == 1, 30, "the worker was not counted")

    release = tmp_path / "release"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, f"{gateway}/ext", json={"wait_for": str(release)}, timeout=40)
        wait_for(lambda: status(processes)["in_flight"] == 1, 20, "the worker did not take the request")
        os.kill(victim.pid, signal.SIGKILL)  # its host is gone: no goodbye, no pid anyone can look at
        victim.wait(5)
        release.touch()
        survivor = processes.spawn("worker-survivor", "worker", "ext")
        reply = held.result(timeout=40)
    assert reply.status_code == 200 and reply.json()["pid"] == survivor.pid, reply.text  # its one retry
    s = status(processes)
    assert [r["pid"] for r in s["replicas"]] == [survivor.pid] and s["dead_letters"] == 0


def test_a_worker_with_nothing_to_serve_says_so_and_exits(processes: Processes, tmp_path: Path) -> None:
    missing = streamserve(processes, "worker", "nosuch")
    assert missing.returncode == 1 and "no deployment named 'nosuch'" in missing.stderr, missing.stderr
    with redis.Redis.from_url(processes.redis_url) as store:  # its output stream would be kept for good
        assert not store.exists(Keys().logs("nosuch"))

    processes.run("deploy", str(write_config(tmp_path / "ext.yaml", "1")))
    stale = streamserve(processes, "worker", "ext", "--version", "0")
    assert stale.returncode == 1 and "not 0 (--version)" in stale.stderr, stale.stderr
    s = status(processes)
    assert s["replicas"] == []  # neither ever heartbeat

    # Pinned to the version deployed now: serves, then leaves with an error once the deployment moves on.
    pinned = processes.spawn("worker-pinned", "worker", "ext", "--version", "1")
    processes.spawn("scheduler", "scheduler")
    wait_for(lambda: status(processes)["running"] == 1, 30, "the pinned worker was not counted")
    processes.run("deploy", str(write_config(tmp_path / "ext.yaml", "2")))
    assert pinned.wait(20) == 1
    assert "moved on from version 1" in processes.log("worker-pinned").read_text()


def test_a_worker_written_off_while_it_stalled_exits_1_when_it_comes_back(
    processes: Processes, gateway: str, tmp_path: Path
) -> None:
    """A worker whose heartbeats stopped (here: stopped by SIGSTOP; a host cut off from Redis alike) is written off,
    and what it held is freed for others. Back, it must not serve on unseen (what it read would be freed and run
    again, over and over): it exits 1, for its supervisor to start it again, and a new worker joins."""
    processes.spawn("scheduler", "scheduler")
    processes.run("deploy", str(write_config(tmp_path / "ext.yaml", "1")))
    stalled = processes.spawn("worker-stalled", "worker", "ext")
    wait_for(lambda: status(processes)["running"] == 1, 30, "the worker was not counted")
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: status(processes)["running"] == 0, 30, "the stalled worker was never written off")
        # Its supervisor replaces it, not the scheduler: status says what the scheduler did.
        message = status(processes)["message"]
        assert "wrote off dead worker ext#" in message and "no heartbeat for" in message, message
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    assert stalled.wait(30) == 1
    fresh = processes.spawn("worker-fresh", "worker", "ext")
    reply = httpx.post(f"{gateway}/ext", json="after", timeout=30)
    assert reply.status_code == 200 and reply.json()["pid"] == fresh.pid, reply.text


def test_a_worker_removed_before_it_saw_its_record_exits_1_when_it_comes_back(
    processes: Processes, gateway: str, tmp_path: Path
) -> None:
    """A worker stalled before any beat of its own brought back its record: here before a scheduler ran at all,
    which then drops its silent heartbeat (and frees what it held). Back, it said nothing new, so nobody looked at
    it again: it served on, unseen (found by CI, as a stall just after the worker's first beat). It must exit 1."""
    processes.run("deploy", str(write_config(tmp_path / "ext.yaml", "1")))
    stalled = processes.spawn("worker-stalled", "worker", "ext")
    beats = Keys().heartbeats("ext")
    with redis.Redis.from_url(processes.redis_url) as store:
        wait_for(lambda: store.hlen(beats) == 1, 30, "the worker did not beat")
        os.kill(stalled.pid, signal.SIGSTOP)
        try:
            processes.spawn("scheduler", "scheduler")
            wait_for(lambda: store.hlen(beats) == 0, 30, "the silent worker's heartbeat was never removed")
        finally:
            os.kill(stalled.pid, signal.SIGCONT)
    assert stalled.wait(30) == 1
    assert "wrote it off (its heartbeat was removed while it was silent)" in processes.log("worker-stalled").read_text()


def test_a_version_none_of_the_workers_can_start_fails_its_deploy_wait(
    processes: Processes, gateway: str, tmp_path: Path
) -> None:
    """Each worker takes new code in place: when none can start on it, every one is gone; `deploy --wait` said
    done (exit 0), with 0 running (found by an outside tester)."""
    config = write_config(tmp_path / "ext.yaml", "1")
    processes.spawn("scheduler", "scheduler")
    processes.run("deploy", str(config))
    worker = processes.spawn("worker-1", "worker", "ext")
    wait_for(lambda: status(processes)["running"] == 1, 30, "the worker was not counted")
    config.write_text(CONFIG.format(version="2").replace("tests.deployments:whoami", "tests.deployments:no_such"))
    deployed = streamserve(processes, "deploy", str(config), "--wait", "--timeout", "60")
    assert deployed.returncode == 1, (deployed.stdout, deployed.stderr)
    assert "no_such" in deployed.stderr, deployed.stderr
    assert worker.wait(30) != 0  # it failed to start on the new code


def test_a_version_one_worker_starts_on_is_done_though_another_failed_before_it_was_up(
    processes: Processes, gateway: str, tmp_path: Path
) -> None:
    """All workers take new code at once: one failing fast while another still loads it failed the goal, though
    the deployment then ran the version, HEALTHY (found by an outside tester; with the failure coming later, done)."""
    config = tmp_path / "ext.yaml"
    config.write_text(
        CONFIG.format(version="1").replace("tests.deployments:whoami", "tests.deployments:StartsWhereLet")
    )
    processes.spawn("scheduler", "scheduler")
    processes.run("deploy", str(config))
    processes.spawn("worker-1", "worker", "ext")
    cannot = processes.spawn("worker-2", "worker", "ext", env={"TEST_CANNOT_RUN_V2": "1"})
    wait_for(lambda: status(processes)["running"] == 2, 30, "the workers were not counted")
    config.write_text(config.read_text() + "    init_kwargs: {v: 2}\n")
    deployed = streamserve(processes, "deploy", str(config), "--wait", "--timeout", "60")
    assert deployed.returncode == 0 and "ext: done" in deployed.stdout, (deployed.stdout, deployed.stderr)
    assert cannot.wait(30) != 0
    assert httpx.post(f"{gateway}/ext", json=None, timeout=10).json() == {"v": 2}
