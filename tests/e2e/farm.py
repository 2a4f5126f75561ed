"""Run `streamserve up` as a real process and clean up every process it led to, by id."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from streamserve.procs import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
STREAMSERVE = str(Path(sys.executable).with_name("streamserve"))
MARKER_VAR = "SSTEST_FARM_TOKEN"
"""Set in the farm's environment; every process the farm starts inherits it, so cleanup can find them all."""


def pids_with_marker(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"{MARKER_VAR}={token}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
    return found


class Farm:
    """``streamserve up CONFIG`` on a free port; ``redis_url`` None means the embedded Redis."""

    def __init__(
        self, config: Path, log_path: Path, redis_url: str | None = None, command: str = STREAMSERVE, cwd: Path = ROOT
    ) -> None:
        self.config = config
        self.command = command
        self.cwd = cwd
        self.port = free_port()
        self.redis_url = redis_url
        self.redis_port = None if redis_url else free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.token = uuid.uuid4().hex
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def effective_redis_url(self) -> str:
        return self.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
        env.update({MARKER_VAR: self.token, "STREAMSERVE_HEARTBEAT_INTERVAL_S": "0.2"})
        env["STREAMSERVE_HEARTBEAT_TIMEOUT_S"] = "2"
        return env

    def start(self, timeout_s: float = 60.0) -> Farm:
        cmd = [self.command, "up", str(self.config), "--port", str(self.port)]
        cmd += ["--redis-url", self.redis_url] if self.redis_url else ["--redis-port", str(self.redis_port)]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=self.cwd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        up = wait_until(lambda: b"streamserve is up" in self.log() or self.proc.poll() is not None, timeout_s)  # type: ignore[union-attr]
        if not up or self.proc.poll() is not None:
            self.stop()
            raise AssertionError(f"farm did not come up:\n{self.log().decode(errors='replace')[-4000:]}")
        return self

    def log(self) -> bytes:
        return self.log_path.read_bytes() if self.log_path.exists() else b""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Ctrl-C the farm, wait (bounded); then kill whatever it left behind. Returns `up`'s exit code."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout_s)
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        for pid in pids_with_marker(self.token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return code

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.env(), "REDIS_URL": self.effective_redis_url}
        result = subprocess.run(
            [self.command, *args], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"streamserve {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def status(self) -> dict[str, Any]:
        return {d["name"]: d for d in orjson.loads(self.cli("status", "--json").stdout)["deployments"]}

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=30, **kwargs)


@contextlib.contextmanager
def running_farm(config: Path, log_dir: Path) -> Iterator[Farm]:
    """``streamserve up CONFIG`` with every replica running at its target; stopped (and cleaned up) on exit."""
    farm = Farm(config, log_dir / "up.log")
    farm.start()
    try:
        wait_for(lambda: all(d["running"] == d["target"] for d in farm.status().values()), 60, "replicas not up")
        yield farm
    finally:
        farm.stop()


class Processes:
    """streamserve commands started by a test; ``stop_all`` kills them and everything they started, by id."""

    def __init__(self, redis_url: str, log_dir: Path) -> None:
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.token = uuid.uuid4().hex
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
        env.update({MARKER_VAR: self.token, "REDIS_URL": self.redis_url})
        env.update({"STREAMSERVE_HEARTBEAT_INTERVAL_S": "0.2", "STREAMSERVE_HEARTBEAT_TIMEOUT_S": "2"})
        return env

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Run ``streamserve ARGS`` in the background, logging to ``<log_dir>/<name>.log``."""
        with self.log(name).open("wb") as log:
            proc = subprocess.Popen(
                [STREAMSERVE, *args], cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )
        self.started[name] = proc
        return proc

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``streamserve ARGS`` to completion; raise with its output if it fails."""
        result = subprocess.run(
            [STREAMSERVE, *args], cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, f"streamserve {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def stop_all(self) -> None:
        for pid in pids_with_marker(self.token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.started.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def wait_for(condition: Any, timeout_s: float = 20.0, message: str = "condition not met") -> None:
    assert wait_until(condition, timeout_s, interval_s=0.1), message


def now() -> float:
    return time.monotonic()
