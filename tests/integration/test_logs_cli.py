"""`streamserve logs`: real worker processes ship their output to Redis; the command (a subprocess) shows it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamserve import Client
from streamserve.runtime.processes import wait_until
from streamserve.transport.connections import sync_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.errors import RemoteError
from tests.e2e.farm import ROOT, Processes, wait_for
from tests.integration.conftest import STREAMSERVE

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def chatty(processes: Processes, redis_url: str) -> Iterator[tuple[Client, list[str]]]:
    """Deployment ``chatty`` with two hand-started worker processes, and a client; yields it and the replica ids."""
    cfg = DeploymentConfig(name="chatty", import_path="tests.deployments:chatty", external_scaler_enabled=True)
    with Client(redis_url) as client:
        client.deploy(AppConfig(deployments=[cfg]))
        processes.spawn("worker-a", "worker", "chatty", "--replica-id", "chatty#aaaa0001")
        processes.spawn("worker-b", "worker", "chatty", "--replica-id", "chatty#bbbb0002")
        redis = sync_redis(redis_url)
        try:
            beats = "streamserve:{chatty}:heartbeats"
            wait_for(lambda: sum(b'"ready"' in v for v in redis.hvals(beats)) == 2, 30, "workers not ready")
        finally:
            redis.close()
        yield client, ["chatty#aaaa0001", "chatty#bbbb0002"]


def logs(processes: Processes, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STREAMSERVE, "logs", *args], cwd=ROOT, env=processes.env(), capture_output=True, text=True, timeout=30
    )


def test_logs_show_prints_and_tracebacks_prefixed_with_the_replica(
    chatty: tuple[Client, list[str]], processes: Processes
) -> None:
    client, replicas = chatty
    for i in range(6):
        assert client.call("chatty", i) == i
    with pytest.raises(RemoteError):
        client.call("chatty", "raise")

    def shown() -> str:
        out = logs(processes, "chatty").stdout
        return out if "chatty was asked to raise" in out and "chatty got 5" in out else ""

    assert wait_until(shown, 10), logs(processes, "chatty")
    out = shown()
    lines = out.splitlines()
    assert all(line.split(" | ", 1)[0] in replicas for line in lines), out
    printed = [line for line in lines if "chatty got " in line]
    assert len(printed) == 7 and {line.split(" | ")[0] for line in printed} <= set(replicas)
    # The traceback, line by line, each with the replica's prefix.
    raising = next(line.split(" | ")[0] for line in printed if "'raise'" in line)
    assert f"{raising} | Traceback (most recent call last):" in lines
    assert f"{raising} | RuntimeError: chatty was asked to raise" in lines
    assert any(line.startswith(f"{raising} | ") and "request_id=" in line and "ERROR" in line for line in lines)

    only_a = logs(processes, "chatty", "--replica", "aaaa0001").stdout.splitlines()
    assert only_a and all(line.startswith("chatty#aaaa0001 | ") for line in only_a)
    assert logs(processes, "chatty", "-n", "3").stdout.count("\n") == 3
    assert logs(processes, "chatty", "--since", "10m").stdout == out
    assert logs(processes, "chatty", "--since", "1s").stdout.count("\n") <= len(lines)


def test_follow_shows_new_lines_as_they_come(
    chatty: tuple[Client, list[str]], processes: Processes, tmp_path: Path
) -> None:
    client, _replicas = chatty
    out = tmp_path / "follow.out"
    redis = sync_redis(processes.redis_url)
    try:
        wait_for(lambda: redis.xlen("streamserve:{chatty}:logs") >= 2, 10, "the workers' first lines never arrived")
    finally:
        redis.close()
    with out.open("wb") as sink:
        follower = subprocess.Popen(
            [STREAMSERVE, "logs", "chatty", "-f", "-n", "1"], cwd=ROOT, env=processes.env(), stdout=sink, stderr=sink
        )
    try:
        # It has printed the newest line (each replica's "ready"), so it reads on from there.
        assert wait_until(lambda: " | " in out.read_text(), 10), out.read_text()
        client.call("chatty", "after-follow-started")
        assert wait_until(lambda: "chatty got 'after-follow-started'" in out.read_text(), 10), out.read_text()
        assert follower.poll() is None  # still following
    finally:
        follower.kill()
        follower.wait(5)


def test_bad_input(processes: Processes, redis_url: str) -> None:
    unknown = logs(processes, "nothing-here")
    assert unknown.returncode == 1 and "nothing-here" in unknown.stderr and "no deployment" in unknown.stderr
    with Client(redis_url) as client:
        client.deploy(AppConfig(deployments=[DeploymentConfig(name="quiet", import_path="tests.deployments:chatty")]))
    bad_since = logs(processes, "quiet", "--since", "ten minutes")
    assert bad_since.returncode == 2 and "--since" in bad_since.stderr
    empty = logs(processes, "quiet")
    assert empty.returncode == 0 and empty.stdout == ""
