"""The CLI's exit codes, as scripts see them: 2 for bad usage, 1 for a failure, 130 for Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson

from streamserve.client import Client
from streamserve.runtime.processes import free_port
from tests.harness.paths import STREAMSERVE


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STREAMSERVE, *args], capture_output=True, text=True, timeout=60, check=False)


def test_bad_usage_is_2_and_a_failure_is_1(redis_url: str, tmp_path: Path) -> None:
    usage = run("scale", "echo", "not-a-number", "--redis-url", redis_url)
    assert usage.returncode == 2 and "invalid int value" in usage.stderr
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("deployments:\n  - name: Bad Name\n    import_path: x:y\n")
    assert run("deploy", str(bad_config), "--redis-url", redis_url).returncode == 2
    not_json = run("call", "echo", "{bad", "--redis-url", redis_url)
    assert not_json.returncode == 2 and "error: the body is not valid JSON" in not_json.stderr, not_json.stderr
    inexact = run("call", "echo", "[18446744073709551616]", "--redis-url", redis_url)  # (never sent as a float)
    assert inexact.returncode == 2 and "cannot be carried exactly" in inexact.stderr, inexact.stderr
    missing = run("scale", "nothing-here", "2", "--redis-url", redis_url)
    assert missing.returncode == 1 and "no deployment named 'nothing-here'" in missing.stderr
    not_there = run("delete", "nothing-here", "--redis-url", redis_url)  # (delete takes an endpoint too)
    assert not_there.returncode == 1 and "no deployment or endpoint named 'nothing-here'" in not_there.stderr
    bad_id = run("worker", "echo", "--replica-id", "x1", "--redis-url", redis_url)
    assert bad_id.returncode == 2 and "Traceback" not in bad_id.stderr, bad_id.stderr
    assert "error: --replica-id: not a replica id: 'x1' (one is DEPLOYMENT#ID" in bad_id.stderr, bad_id.stderr
    # A URL naming a database the server has not is a usage error, whichever command finds it (`status` said 1).
    no_such_db = redis_url.rsplit("/", 1)[0] + "/99"
    for command in (("status",), ("call", "echo", "1")):
        wrong_db = run(*command, "--redis-url", no_such_db)
        assert wrong_db.returncode == 2 and "has no database of the number" in wrong_db.stderr, wrong_db.stderr


def test_up_with_a_data_dir_or_host_it_cannot_use_is_2_before_it_starts_anything(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("deployments:\n  - name: first\n    import_path: examples.echo:Echo\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("hi")
    port = str(free_port())
    for data_dir, why in ((a_file, "File exists"), (a_file / "sub", "Not a directory")):
        up = run("up", str(config), "--port", port, "--redis-port", str(free_port()), "--data-dir", str(data_dir))
        assert up.returncode == 2 and "Traceback" not in up.stderr, up.stderr
        assert f"error: --data-dir {data_dir}: cannot be made a directory: {why}" in up.stderr
    bad_host = run("up", str(config), "--port", port, "--host", "256.1.1.1", "--data-dir", str(tmp_path / "d"))
    assert bad_host.returncode == 2, bad_host.stderr
    assert "error: --host 256.1.1.1: the gateway cannot listen there: '256.1.1.1' is no address" in bad_host.stderr


def test_deploy_says_what_it_created_and_what_it_updated(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("deployments:\n  - name: first\n    import_path: examples.echo:Echo\n")
    assert run("deploy", str(config), "--redis-url", redis_url).stdout.startswith("first: created (goal ")
    text = "deployments:\n  - name: first\n    import_path: examples.echo:Echo\n    num_replicas: 2\n"
    config.write_text(text + "  - name: second\n    import_path: examples.echo:Echo\n")
    lines = run("deploy", str(config), "--redis-url", redis_url).stdout.splitlines()
    assert [line.split(" (goal")[0] for line in lines] == ["first: updated", "second: created"]
    assert run("deploy", str(config), "--redis-url", redis_url).stdout == "no change\n"


def test_ctrl_c_is_130_without_a_traceback(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"  # no scheduler runs: the goal is never reached, --wait waits
    config.write_text("deployments:\n  - name: never\n    import_path: examples.echo:Echo\n")
    proc = subprocess.Popen(
        [STREAMSERVE, "deploy", str(config), "--wait", "--timeout", "60", "--redis-url", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the write is done and the wait has begun
        assert "never: created" in first
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 130
    assert "interrupted" in err and "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`streamserve manifests ... | head -1`: the reader closes the pipe while the command still writes (24 KB here).
    The command ends with 141, as a shell reports a process ended by SIGPIPE, and prints no traceback."""
    config = tmp_path / "farm.yaml"
    config.write_text("deployments:\n  - name: echo\n    import_path: examples.echo:Echo\n    num_replicas: 40\n")
    argv = [STREAMSERVE, "manifests", str(config), "--image", "example/streamserve:1"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as command:
        assert command.stdout is not None and command.stderr is not None
        command.stdout.close()  # before it wrote anything: its writes all find the pipe closed
        errors = command.stderr.read().decode()
        assert command.wait(timeout=60) == 141, errors
    assert errors == ""


def test_a_propagator_not_installed_keeps_no_role_from_starting() -> None:
    """OpenTelemetry raises at import for it, and the gateway imports FastAPI, which imports OpenTelemetry: `up` said
    only that the gateway did not come up."""
    env = {**os.environ, "OTEL_PROPAGATORS": "b3"}
    shown = subprocess.run(
        [STREAMSERVE, "gateway", "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "warning: OTEL_PROPAGATORS names b3, not installed here" in shown.stderr


def test_up_with_embedded_options_beside_a_named_redis_says_where_it_was_named(redis_url: str, tmp_path: Path) -> None:
    """REDIS_URL set in the environment (no --redis-url given): the message names it, not only the option."""
    config = tmp_path / "c.yaml"
    config.write_text("deployments:\n  - name: first\n    import_path: examples.echo:Echo\n")
    env = {**os.environ, "REDIS_URL": redis_url}
    port = str(free_port())  # (nothing listens there: the check comes first)
    refused = subprocess.run(
        [STREAMSERVE, "up", str(config), "--redis-port", "6399", "--data-dir", str(tmp_path / "d"), "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    assert "are for the embedded Redis, and a Redis is named" in refused.stderr
    assert "REDIS_URL" in refused.stderr and "drop them, or name no Redis" in refused.stderr


def test_a_wait_that_no_scheduler_will_end_says_so(redis_url: str, tmp_path: Path) -> None:
    """No scheduler runs (the roles run apart, and it stopped): a goal waited for is never reached, and the error says
    why rather than only that time ran out."""
    config = tmp_path / "c.yaml"
    config.write_text("deployments:\n  - name: first\n    import_path: examples.echo:Echo\n")
    assert run("deploy", str(config), "--redis-url", redis_url).returncode == 0
    unchanged = run("deploy", str(config), "--wait", "--timeout", "0.5", "--redis-url", redis_url)  # (no goal: health)
    assert unchanged.returncode == 1, unchanged.stderr
    assert "first: not healthy in time: no scheduler leads" in unchanged.stderr, unchanged.stderr
    waited = run("scale", "first", "3", "--wait", "--timeout", "0.5", "--redis-url", redis_url)
    assert waited.returncode == 1, waited.stderr
    assert "not reached in 0.5s: no scheduler leads (none runs, or none reaches Redis)" in waited.stderr, waited.stderr


def test_delete_drain_waits_for_what_the_deployment_holds_and_deletes_nothing_in_time(
    redis_url: str, tmp_path: Path
) -> None:
    """`delete --drain` (the tutorial's last step, after a traffic change moved an endpoint off it): deleted at once,
    the requests it still held were answered 404."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "deployments:\n  - name: busy\n    import_path: examples.echo:Echo\n"
        "  - name: idle\n    import_path: examples.echo:Echo\n"
    )
    assert run("deploy", str(config), "--redis-url", redis_url).returncode == 0
    with Client(redis_url) as client:  # no replica runs: they stay queued
        client.send("busy", 1)
        client.send("busy", 2)
    assert run("traffic", "front", "busy=1", "--redis-url", redis_url).returncode == 0
    sent_to = run("delete", "busy", "--drain", "--timeout", "30", "--redis-url", redis_url)  # refused at once
    assert sent_to.returncode == 1 and "busy: endpoint(s) front still send to it" in sent_to.stderr, sent_to.stderr
    assert run("delete", "front", "--redis-url", redis_url).returncode == 0
    held = run("delete", "busy", "--drain", "--timeout", "0.5", "--redis-url", redis_url)
    assert held.returncode == 1, held.stderr
    assert "busy: 2 request(s) queued or running" in held.stdout, held.stdout
    assert "busy: still holds 2 request(s), queued or running: not deleted" in held.stderr, held.stderr
    drained = run("delete", "idle", "--drain", "--timeout", "5", "--redis-url", redis_url)
    assert drained.returncode == 0 and "idle: deleting" in drained.stdout, drained.stdout + drained.stderr
    left = run("status", "--json", "--redis-url", redis_url)
    assert [d["name"] for d in orjson.loads(left.stdout)["deployments"]] == ["busy"], left.stdout
