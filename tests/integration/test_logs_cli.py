"""`streamserve logs`: real worker processes ship their output to Redis; the command (a subprocess) shows it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamserve import Client
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import sync_redis
from streamserve.transport.streams import LOG_STREAM_LINES
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.errors import RemoteError
from tests.harness.farm import Processes
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

# How long after its print a replica is killed: time for its threads to read the line (a busy machine may hold them
# off for tens of ms), well short of the 0.2 s between the batches the lines once waited for.
KILLED_AFTER_S = 0.1


def run_workers(client: Client, processes: Processes, settings: Settings, name: str, replica_ids: list[str]) -> None:
    """Deploy ``tests.deployments:NAME`` (scaled by hand) and start one worker process per replica id, as a user
    would; return once every one is ready."""
    cfg = DeploymentConfig(name=name, import_path=f"tests.deployments:{name}", external_scaler_enabled=True)
    client.deploy(AppConfig(deployments=[cfg]))
    for replica_id in replica_ids:
        processes.spawn(f"worker-{replica_id}", "worker", name, "--replica-id", replica_id)
    redis = sync_redis(settings.effective_redis_url)
    try:
        beats = settings.keys.heartbeats(name)
        ready = len(replica_ids)
        wait_for(lambda: sum(b'"ready"' in v for v in redis.hvals(beats)) == ready, 30, "workers not ready")
    finally:
        redis.close()


@pytest.fixture
def chatty(processes: Processes, settings: Settings) -> Iterator[tuple[Client, list[str]]]:
    """Deployment ``chatty`` with two hand-started worker processes, and a client; yields it and the replica ids."""
    replicas = ["chatty#aaaa0001", "chatty#bbbb0002"]
    with Client(settings.effective_redis_url) as client:
        run_workers(client, processes, settings, "chatty", replicas)
        yield client, replicas


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

    wait_for(shown, 10, lambda: str(logs(processes, "chatty")))
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
    no_such = logs(processes, "chatty", "--replica", "nosuch")
    assert no_such.returncode == 1 and "no output from a replica 'nosuch' of 'chatty'" in no_such.stderr
    assert logs(processes, "chatty", "-n", "3").stdout.count("\n") == 3
    assert logs(processes, "chatty", "--since", "10m").stdout == out
    assert logs(processes, "chatty", "--since", "30000d").stdout == out  # from before 1970: all there is
    assert logs(processes, "chatty", "--since", "10m", "-n", "3").stdout.splitlines() == lines[-3:]
    assert logs(processes, "chatty", "--since", "1s").stdout.count("\n") <= len(lines)


def test_follow_shows_new_lines_as_they_come(
    chatty: tuple[Client, list[str]], processes: Processes, settings: Settings, tmp_path: Path
) -> None:
    client, _replicas = chatty
    out = tmp_path / "follow.out"
    redis = sync_redis(processes.redis_url)
    try:
        wait_for(lambda: redis.xlen(settings.keys.logs("chatty")) >= 2, 10, "the workers' first lines never arrived")
    finally:
        redis.close()
    with out.open("wb") as sink:
        follower = subprocess.Popen(
            [STREAMSERVE, "logs", "chatty", "-f", "-n", "1"], cwd=ROOT, env=processes.env(), stdout=sink, stderr=sink
        )
    try:
        # It has printed the newest line (each replica's "ready"), so it reads on from there.
        wait_for(lambda: " | " in out.read_text(), 10, out.read_text)
        client.call("chatty", "after-follow-started")
        wait_for(lambda: "chatty got 'after-follow-started'" in out.read_text(), 10, out.read_text)
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


# More than the stream keeps, printed in bursts each smaller than the replica's own buffer of waiting lines (which
# drops the oldest past its bound): each burst reaches Redis whole, so only the stream's cap can bound its length.
FLOOD_BURSTS = 3
FLOOD_BURST_LINES = 5_000


def test_the_log_stream_keeps_only_the_newest_lines(processes: Processes, settings: Settings) -> None:
    stream = settings.keys.logs("flood")
    redis = sync_redis(settings.effective_redis_url)
    try:
        with Client(settings.effective_redis_url) as client:
            run_workers(client, processes, settings, "flood", ["flood#aaaa0001"])
            for burst in range(FLOOD_BURSTS):
                client.call("flood", {"burst": burst, "lines": FLOOD_BURST_LINES}, timeout=60)
                last = f"flood {burst} {FLOOD_BURST_LINES - 1}".encode()

                def shipped(last: bytes = last) -> bool:
                    return any(fields[b"line"] == last for _id, fields in redis.xrevrange(stream, count=20))

                # The pause between bursts: this one is all in Redis before the next begins.
                wait_for(shipped, 30, f"{last!r} never reached the log stream")
        # Trimming is approximate (XADD MAXLEN ~): Redis removes whole nodes of the stream only, so up to one
        # node's worth of entries more than the cap may remain.
        node = int(redis.config_get("stream-node-max-entries")["stream-node-max-entries"])
        length = redis.xlen(stream)
        assert LOG_STREAM_LINES <= length <= LOG_STREAM_LINES + node, length
        kept = [fields[b"line"].decode() for _id, fields in redis.xrange(stream)]
    finally:
        redis.close()
    printed = [f"flood {burst} {n}" for burst in range(FLOOD_BURSTS) for n in range(FLOOD_BURST_LINES)]
    flooded = [line for line in kept if line.startswith("flood ")]
    assert flooded == printed[-len(flooded) :]  # the newest, in order, none missing up to the last one printed


def test_what_a_replica_printed_just_before_it_was_killed_is_in_its_logs(
    processes: Processes, settings: Settings, tmp_path: Path
) -> None:
    """Each line is shipped as soon as it is read, not at the next of a timer's ticks: a replica killed (-9, the OOM
    killer) moments after it printed leaves the line in `streamserve logs` (with a 0.2 s tick, half were lost, and
    the three lines here were all kept one time in eight)."""
    replicas = ["last_words#aaaa0001", "last_words#bbbb0002", "last_words#cccc0003"]
    with Client(settings.effective_redis_url) as client:
        run_workers(client, processes, settings, "last_words", [])
        for n, replica_id in enumerate(replicas):
            worker = processes.spawn(f"worker-{replica_id}", "worker", "last_words", "--replica-id", replica_id)
            ready = f"replica {replica_id}: ready"  # (shipped: its shipper has connected, and waits for lines)
            wait_for(lambda: ready in logs(processes, "last_words").stdout, 30, f"{replica_id} not ready")  # noqa: B023
            marker = tmp_path / f"printed-{n}"
            client.submit("last_words", {"words": f"of {replica_id}", "marker": str(marker)})
            wait_for(marker.exists, 30, f"{replica_id} did not print", interval_s=0.01)
            time.sleep(KILLED_AFTER_S)  # (not a wait for a condition: the time a crash leaves, which is the point)
            worker.kill()
            worker.wait(10)

    def shown() -> str:
        out = logs(processes, "last_words").stdout
        return out if all(f"last words of {r}" in out for r in replicas) else ""

    wait_for(shown, 10, lambda: str(logs(processes, "last_words")))
