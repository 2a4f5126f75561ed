"""`streamserve up` with its embedded Redis: it starts everything and Ctrl-C stops everything."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import redis

from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port, port_is_free, stop_group
from streamserve.wire.keys import CONSUMER_GROUP, DEFAULT_PREFIX, Keys
from tests.harness.farm import Farm, farm_on, pids_with_marker
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def readme_python() -> str:
    """The README's Python blocks, in order, as one script: what a user pastes into a file and runs."""
    return "\n".join(PYTHON_BLOCK.findall((ROOT / "README.md").read_text()))


def test_up_serves_the_example_and_ctrl_c_leaves_nothing_behind(tmp_path: Path) -> None:
    farm = Farm(ROOT / "examples" / "streamserve.yaml", tmp_path / "up.log")
    farm.start()
    try:
        log = farm.log().decode()
        assert f"gateway   {farm.base_url}" in log
        assert f"redis     redis://***@127.0.0.1:{farm.redis_port}/0  (embedded)" in log
        # The embedded Redis takes a password (whoever writes Redis deploys code), which the banner never shows.
        password = (farm.data_dir / "redis_password").read_text().strip()
        assert password not in log and len(password) >= 32
        assert f"redis-cli REDISCLI_AUTH=$(cat {farm.data_dir}/redis_password) redis-cli -p {farm.redis_port}" in log
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=farm.redis_port).ping()
        assert stat.S_IMODE(farm.data_dir.stat().st_mode) == 0o700
        assert {name: d["running"] for name, d in farm.status().items()} == {
            "echo": 2,
            "sleepy": 1,
            "add": 1,
            "batched": 1,
            "tokens": 1,
            "forecast": 2,
        }
        resp = farm.post("/echo", {"x": [1, 2, 3]})
        assert resp.status_code == 200 and resp.json()["echo"] == {"x": [1, 2, 3]}
        started = pids_with_marker(farm.token)
        # up, scheduler, gateway, 2 job workers and 8 replicas; redis-server overwrites its environ with its
        # process title, so it is checked by its port below.
        assert len(started) == 1 + 2 + 2 + 8
        # The README's Python, pasted as it stands, runs against this farm from the checkout (it deploys the
        # example's file by its relative path).
        script = subprocess.run(
            [sys.executable, "-c", readme_python()],
            cwd=ROOT,
            env={**os.environ, "REDIS_URL": farm.effective_redis_url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert script.returncode == 0, script.stderr[-3000:]
        printed = script.stdout.splitlines()
        assert "asked to fail with 1" in printed[0] and printed[1:4] == ["one", "at", "a"], script.stdout
        assert "sleepy" not in farm.status()
        assert farm.proc is not None
        before_stop = len(farm.log())
        farm.proc.send_signal(2)  # Ctrl-C
        assert farm.proc.wait(40) == 0
        # What Ctrl-C prints says what stopped, nothing that reads as news of a farm still at work.
        stop_lines = farm.log()[before_stop:].decode()
        for misleading in ("adopted", ": HEALTHY", ": UPDATING", "still finishing its job"):
            assert misleading not in stop_lines, stop_lines
        assert pids_with_marker(farm.token) == []
        assert port_is_free("127.0.0.1", farm.port)
        assert farm.redis_port is not None
        assert port_is_free("127.0.0.1", farm.redis_port)
    finally:
        farm.stop()


def test_up_with_bad_config_names_the_field_and_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  - name: echo\n    import_path: examples.echo\n")
    result = subprocess.run([STREAMSERVE, "up", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "deployment 'echo' (deployments[0]): import_path" in result.stderr


def test_up_with_an_endpoint_to_no_deployment_exits_2_naming_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    """A problem only the farm's whole desired state shows (seen once its Redis runs) is a config error too."""
    config = tmp_path / "stray.yaml"
    config.write_text("endpoints:\n  - name: stray\n    traffic: {nosuch: 1}\n")
    redis_port = free_port()
    command = [STREAMSERVE, "up", str(config), "--port", str(free_port()), "--redis-port", str(redis_port)]
    result = subprocess.run(
        [*command, "--data-dir", str(tmp_path / "data")], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert f"error: {config}: endpoint 'stray' sends to 'nosuch', which is not a deployment" in result.stderr
    assert port_is_free("127.0.0.1", redis_port)  # its embedded Redis stopped with it


def test_up_whose_jobs_redis_does_not_answer_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    """Its job workers would fail on it, and be restarted with backoff for good: `up` stops first, in one line."""
    config = tmp_path / "farm.yaml"
    config.write_text("deployments: []\n")
    redis_port = free_port()
    jobs_url = f"redis://:s3cret@127.0.0.1:{free_port()}/2"  # nothing listens there
    command = [STREAMSERVE, "up", str(config), "--port", str(free_port()), "--redis-port", str(redis_port)]
    result = subprocess.run(
        [*command, "--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        env={**os.environ, "STREAMSERVE_JOBS_REDIS_URL": jobs_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: cannot reach Redis at redis://***@127.0.0.1:"), result.stderr
    assert "s3cret" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert port_is_free("127.0.0.1", redis_port)  # its embedded Redis stopped with it


def test_ctrl_c_stops_up_at_once_while_it_waits_on_a_redis_that_hangs(tmp_path: Path) -> None:
    """Before it starts the farm's processes, `up` waits on its Redis (here stopped with SIGSTOP): it said "stopping
    (again to force)" and went on waiting a minute, through every further Ctrl-C."""
    server = EmbeddedRedis(port=free_port()).start()
    try:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        config = tmp_path / "farm.yaml"
        config.write_text("deployments: []\n")
        command = [STREAMSERVE, "up", str(config), "--port", str(free_port()), "--data-dir", str(tmp_path / "data")]
        up = subprocess.Popen(
            [*command, "--redis-url", server.url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            # Into one of its waits on that Redis (its checks of 1 s a command, then the config's write, the longest);
            # a signal that comes in any of them is taken alike.
            wait_for(
                lambda: connected_to(up.pid, server.port) or up.poll() is not None, 30, "up never reached its Redis"
            )
            assert up.poll() is None, up.communicate()
            up.send_signal(signal.SIGINT)
            out, err = up.communicate(timeout=10)
        finally:
            stop_group(up, timeout_s=5)
        assert up.returncode == 130, (out, err)
        assert "stopping" in out, (out, err)
    finally:
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()


def test_up_says_which_deployment_cannot_start_and_serves_the_rest(tmp_path: Path) -> None:
    config = tmp_path / "mixed.yaml"
    config.write_text(
        "deployments:\n"
        "  - {name: broken, import_path: 'tests.deployments:FailingConstructor', graceful_shutdown_timeout_s: 1}\n"
        "  - {name: fine, import_path: 'examples.functions:noop', graceful_shutdown_timeout_s: 1}\n"
    )
    farm = Farm(config, tmp_path / "up.log")
    farm.start()
    try:
        log = farm.log().decode()
        assert "broken: 1 replica(s)" in log and "NOT RUNNING: RuntimeError: weights not found" in log
        assert "fine: 1 replica(s), POST" in log.split("NOT RUNNING")[-1]
        assert farm.post("/fine", [1]).json() == [1]
    finally:
        assert farm.stop() == 0


def test_second_ctrl_c_stops_at_once_even_while_the_gateway_drains(tmp_path: Path) -> None:
    farm = Farm(ROOT / "examples" / "streamserve.yaml", tmp_path / "up.log")
    farm.start()
    try:

        def hold_a_request() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the forced stop cuts it off
                farm.post("/sleepy", {"seconds": 60})

        held = threading.Thread(target=hold_a_request)
        held.start()
        wait_for(lambda: farm.status()["sleepy"]["in_flight"] == 1, 10, "the long request never reached a replica")
        assert farm.proc is not None
        farm.proc.send_signal(signal.SIGINT)
        # The gateway closes its socket first, then drains what it holds: Ctrl-C again in the middle of that.
        wait_for(lambda: port_is_free("127.0.0.1", farm.port), 10, "the gateway did not begin to stop")
        farm.proc.send_signal(signal.SIGINT)
        # The gateway alone may drain for 10 s after one Ctrl-C; the second ends everything without waiting.
        assert farm.proc.wait(8) is not None
        assert pids_with_marker(farm.token) == []
        held.join(5)
    finally:
        farm.stop()


def test_a_stream_open_when_up_stops_is_cancelled_in_its_replica(tmp_path: Path) -> None:
    """The gateway drains what it holds, then cancels it, in the replicas too: `up` killed it as its drain ended, so a
    40 s stream ran on in its replica until the replica's own drain cut it (up took 30 s to stop), and the gateway,
    given the time, logged a traceback for the response it cut. A unary call it cancels so is answered 503 in the
    gateway's JSON (uvicorn's own answer was a bare plain-text 500), and the stream ends with the error line that
    says why (it was cut with none)."""
    farm = Farm(ROOT / "examples" / "streamserve.yaml", tmp_path / "up.log")
    farm.start()
    try:
        unary: list[httpx.Response] = []
        slow = threading.Thread(
            target=lambda: unary.append(httpx.post(f"{farm.base_url}/sleepy", json={"seconds": 40}, timeout=60))
        )
        slow.start()
        # A call with an idempotency key is not cancelled: its run ends and keeps its reply. Its caller was told
        # "the request was cancelled", and a payment's client would send it again with a new key (found by an
        # outside tester).
        keyed: list[httpx.Response] = []
        key = {"Idempotency-Key": f"stopped-{farm.token}"}
        post_keyed = lambda: keyed.append(  # noqa: E731
            httpx.post(f"{farm.base_url}/sleepy", json={"seconds": 12}, headers=key, timeout=60)
        )
        keyed_caller = threading.Thread(target=post_keyed)
        keyed_caller.start()
        with redis.Redis.from_url(farm.effective_redis_url) as farm_redis:
            sleepy = Keys(DEFAULT_PREFIX).requests("sleepy")
            wait_for(lambda: farm_redis.xpending(sleepy, CONSUMER_GROUP)["pending"] == 2, 20, "the calls never ran")
        opened = threading.Event()
        lines: list[str] = []

        def read_a_long_stream() -> None:
            text = " ".join(["w"] * 80)
            body = {"text": text, "delay_s": 0.5}
            with (
                contextlib.suppress(httpx.HTTPError),  # the stop cuts it off
                httpx.stream("POST", f"{farm.base_url}/tokens", json=body, timeout=60) as answer,
            ):
                for line in answer.iter_lines():
                    lines.append(line)
                    opened.set()

        reader = threading.Thread(target=read_a_long_stream)
        reader.start()
        assert opened.wait(20), "the stream never began"
        assert farm.proc is not None
        farm.proc.send_signal(signal.SIGTERM)
        assert farm.proc.wait(60) == 0
        reader.join(5)
        slow.join(5)
        keyed_caller.join(5)
        assert keyed[0].status_code == 503, keyed[0].text
        said = keyed[0].json()["message"]
        assert "its run goes on and keeps its reply" in said and "same Idempotency-Key" in said, said
        assert "cancelled" not in said, said
        assert unary[0].status_code == 503, unary[0].text
        assert unary[0].json()["error"] == "UnavailableError", unary[0].text
        assert "the gateway stopped before request" in unary[0].json()["message"], unary[0].text
        last = json.loads(lines[-1])
        assert last["error"] == "UnavailableError", lines[-3:]
        assert "the gateway stopped before stream" in last["message"], lines[-3:]
        log = farm.log().decode()
        assert re.search(r"replica tokens#\w+: stop requested, draining 0 in flight", log), log[-3000:]
        assert re.search(r"replica tokens#\w+: exited after 1 requests \(0 failed\)", log), log[-3000:]
        assert "Exception in ASGI application" not in log, log[-3000:]
        assert pids_with_marker(farm.token) == []
    finally:
        farm.stop()


RESTART_CONFIG = """
deployments:
  - {name: slow, import_path: 'tests.deployments:SlowStart', init_kwargs: {seconds: 2}, num_replicas: 2,
     route_prefix: /slow, graceful_shutdown_timeout_s: 1}
  - name: idle
    import_path: examples.functions:noop
    autoscaling_config: {min_replicas: 0, max_replicas: 2}
  - {name: outside, import_path: 'examples.functions:noop', external_scaler_enabled: true}
"""


def test_up_again_on_the_same_config_prints_its_banner_once_the_replicas_run(tmp_path: Path) -> None:
    """`up` again, nothing in the config changed (so no goal to wait on): the banner still waits for the replicas,
    and names the deployments and endpoints kept in Redis that the config does not."""
    farm = farm_on(RESTART_CONFIG, tmp_path)
    farm.start()
    try:
        extra = tmp_path / "extra.yaml"
        extra.write_text("deployments:\n  - {name: extra, import_path: 'examples.functions:noop'}\n")
        farm.cli("deploy", str(extra), "--wait")
        farm.cli("traffic", "split", "extra=1")
    finally:
        assert farm.stop() == 0

    farm.start()  # same data directory: Redis holds the same config, so this `up` changes nothing
    try:
        status = farm.status()  # at once: no waiting after the banner
        assert {n: (d["running"], d["target"]) for n, d in status.items() if n in ("slow", "idle")} == {
            "slow": (2, 2),
            "idle": (0, 0),
        }, status
        log = farm.log().decode()
        assert "config    " in log and "(updated:" not in log, log
        assert "NOT RUNNING" not in log, log
        assert f"  - extra: 1 replica(s), POST {farm.base_url}/extra  (kept from Redis, not in the config)" in log, log
        kept = "(kept from Redis, not in the config)"
        assert f"  - split: endpoint over extra, POST {farm.base_url}/split  {kept}" in log, log
        assert farm.post("/slow", [1]).json() == [1]
    finally:
        assert farm.stop() == 0


def connected_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP connection to 127.0.0.1:``port`` (/proc/net/tcp's sockets, by inode)."""
    inodes = {
        fields[9]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if (fields := line.split())[2] == f"0100007F:{port:04X}"
    }
    try:
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    return any(f"socket:[{inode}]" in held for inode in inodes)
