"""What replicas print and what Redis holds cannot drive the terminal of `streamserve logs` or `streamserve status`
(control characters are shown as escapes, ``logs --raw`` prints them as they were), and a huge line of output is
shipped cut to MAX_LINE_BYTES, marked, without holding up the lines after it. Real worker processes, real CLI."""

from __future__ import annotations

import subprocess

import pytest

from streamserve import Client
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import sync_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.messages import DeploymentHealthRecord, ReplicaRecord, now_ms
from streamserve.wire.printable import printable
from streamserve.wire.states import DeploymentHealth, ReplicaState
from streamserve.workers.output_shipper import MAX_LINE_BYTES, cut_marker
from tests.harness.farm import Processes
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for
from tests.output_deployments import AFTER_LONG_LINE

pytestmark = pytest.mark.timeout(120)

# An OSC 52 clipboard write, a screen clear, a carriage return that would hide what came before, a bidi override.
HOSTILE = "clipboard \x1b]52;c;aGkgdGhlcmU=\x07 clear \x1b[2J hidden\rshown \u202eevil"
SHOWN = "clipboard \\x1b]52;c;aGkgdGhlcmU=\\x07 clear \\x1b[2J hidden\\rshown \\u202eevil"


def start_worker(client: Client, processes: Processes, settings: Settings, name: str) -> None:
    """Deploy ``tests.output_deployments:NAME`` (scaled by hand) and run one worker process for it, ready."""
    cfg = DeploymentConfig(name=name, import_path=f"tests.output_deployments:{name}", external_scaler_enabled=True)
    client.deploy(AppConfig(deployments=[cfg]))
    processes.spawn(f"worker-{name}", "worker", name, "--replica-id", f"{name}#aaaa0001")
    redis = sync_redis(settings.effective_redis_url)
    try:
        beats = settings.keys.heartbeats(name)
        wait_for(lambda: any(b'"ready"' in v for v in redis.hvals(beats)), 30, f"{name}'s worker not ready")
    finally:
        redis.close()


def cli(processes: Processes, *args: str) -> tuple[int, str]:
    """``streamserve ARGS``: its exit code and its output as printed (no newline translation: a \\r stays one)."""
    done = subprocess.run([STREAMSERVE, *args], cwd=ROOT, env=processes.env(), capture_output=True, timeout=30)
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout.decode()


def test_logs_shows_a_handlers_control_characters_as_escapes_and_raw_shows_them_as_printed(
    processes: Processes, settings: Settings
) -> None:
    with Client(settings.effective_redis_url) as client:
        start_worker(client, processes, settings, "printer")
        assert client.call("printer", HOSTILE) == HOSTILE
    wait_for(lambda: SHOWN in cli(processes, "logs", "printer")[1], 10, lambda: str(cli(processes, "logs", "printer")))
    code, shown = cli(processes, "logs", "printer")
    assert code == 0 and f"printer#aaaa0001 | {SHOWN}" in shown.splitlines()
    assert all(line.isprintable() for line in shown.split("\n")), shown
    code, raw = cli(processes, "logs", "printer", "--raw")
    assert code == 0 and f"printer#aaaa0001 | {HOSTILE}\n" in raw


def test_status_and_health_show_control_characters_as_escapes(processes: Processes, settings: Settings) -> None:
    with Client(settings.effective_redis_url) as client:
        client.deploy(AppConfig(deployments=[DeploymentConfig(name="echo", import_path="tests.deployments:Recorder")]))
    # A replica's record and a verdict as the scheduler would write them, with the words of a hostile replica and host.
    now = now_ms()
    verdict = DeploymentHealthRecord(health=DeploymentHealth.UNHEALTHY, message=f"import: {HOSTILE}", updated_ms=now)
    record = ReplicaRecord(
        replica_id="echo#aaaa0001",
        state=ReplicaState.STARTING,
        version="v1",
        host=f"host {HOSTILE}",
        pid=1234,
        created_ms=now,
        updated_ms=now,
        message=f"failed: {HOSTILE}",
    )
    redis = sync_redis(settings.effective_redis_url)
    try:
        redis.hset(settings.keys.replicas("echo"), record.replica_id, record.encode())
        redis.hset(settings.keys.deployment_status(), "echo", verdict.encode())
    finally:
        redis.close()
    code, status = cli(processes, "status")
    assert code == 0 and f"host {SHOWN}" in status and f"failed: {SHOWN}" in status
    assert f"echo: import: {SHOWN}" in status
    assert all(line.isprintable() for line in status.split("\n")), status
    code, health = cli(processes, "health")
    assert code == 1 and f"echo: UNHEALTHY: import: {SHOWN}" in health
    assert all(line.isprintable() for line in health.split("\n")), health


def test_a_50_mb_line_is_shipped_cut_and_marked_and_the_next_line_follows_it(
    processes: Processes, settings: Settings
) -> None:
    size = 50 * 1024 * 1024
    stream = settings.keys.logs("long_line")
    redis = sync_redis(settings.effective_redis_url)
    try:
        with Client(settings.effective_redis_url) as client:
            start_worker(client, processes, settings, "long_line")
            assert client.call("long_line", size, timeout=60) == size

        def shipped() -> list[str]:
            lines = [fields[b"line"].decode() for _id, fields in redis.xrange(stream)]
            return lines if AFTER_LONG_LINE in lines else []

        wait_for(shipped, 30, "the line after the long one never reached the log stream")
        lines = shipped()
    finally:
        redis.close()
    cut = lines[lines.index(AFTER_LONG_LINE) - 1]
    assert cut == "x" * MAX_LINE_BYTES + cut_marker(size)
    assert len(cut.encode()) <= MAX_LINE_BYTES + 100 and f"{size} bytes" in cut
    assert printable(cut) == cut
