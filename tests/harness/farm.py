"""Run `streamserve up`, or single streamserve commands, as real processes, and clean up every process they led to.

One handle on a running farm for the integration and end-to-end tests and the benchmarks (bench/farm.py) alike,
and the one way a test starts a gateway process (``Processes.start_gateway``, ``gateway_process``). Every process a
``Farm`` or ``Processes`` starts carries a marker in its environment, inherited by all it starts in turn; cleanup
kills whatever still carries it, by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from streamserve.runtime.farm_files import ensure_redis_password
from streamserve.runtime.processes import free_port, role_in
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

# Set in the farm's environment; every process the farm starts inherits it, so cleanup can find them all.
MARKER_VAR = "SSTEST_FARM_TOKEN"
# The tests' heartbeats: a dead replica or scheduler is noticed within 2 s.
FAST_HEARTBEATS = {"STREAMSERVE_HEARTBEAT_INTERVAL_S": "0.2", "STREAMSERVE_HEARTBEAT_TIMEOUT_S": "2"}


def pids_with_marker(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"{MARKER_VAR}={token}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
    return found


def kill_marked(token: str) -> None:
    """SIGKILL every process whose environment carries ``token``."""
    for pid in pids_with_marker(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def marked_env(token: str, extra: Mapping[str, str]) -> dict[str, str]:
    """Our environment without any streamserve setting or Redis URL, plus the marker ``token`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
    return {**env, MARKER_VAR: token, **extra}


def descendants(root: int) -> dict[int, bytes]:
    """pid -> raw command line of every live descendant of ``root`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found: dict[int, bytes] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        todo += children.get(pid, [])
    return found


def command_line(pid: int) -> list[str]:
    """The arguments ``pid`` runs with ([] once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    # Each argument ends with a NUL; a retitled process (RQ's, with setproctitle installed) may leave one without.
    raw = raw.rstrip(b"\0")
    return raw.decode(errors="replace").split("\0") if raw else []


def role_of(argv: list[str]) -> str | None:
    """``gateway``, ``scheduler``, ``worker``, ... for ``python -m streamserve ROLE``; ``redis-server``; else None."""
    if (role := role_in(argv)) is not None:
        return role
    if argv and "redis-server" in argv[0]:  # redis-server rewrites its title: "/path/redis-server 127.0.0.1:PORT"
        return "redis-server"
    return None


class Farm:
    """``streamserve up CONFIG`` on a free port; ``redis_url`` None means the embedded Redis, on a free port too.

    ``extra_env`` is added to the environment of `up` (and of ``cli``): by default the tests' fast heartbeats.
    """

    def __init__(
        self,
        config: Path,
        log_path: Path,
        redis_url: str | None = None,
        command: str = STREAMSERVE,
        cwd: Path = ROOT,
        extra_env: Mapping[str, str] = FAST_HEARTBEATS,
        data_dir: Path | None = None,
    ) -> None:
        self.config = config
        self._data_dir = data_dir
        self.command = command
        self.cwd = cwd
        self.extra_env = dict(extra_env)
        self.port = free_port()
        self.redis_url = redis_url
        self.redis_port = None if redis_url else free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.token = uuid.uuid4().hex
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args: list[str] = []  # more `up` options for the next start

    @property
    def data_dir(self) -> Path:
        """Where the embedded Redis keeps its data (a second `start` with the same farm finds it again) and `up` the
        admin token; beside its log unless given."""
        return self._data_dir or self.log_path.parent / f"redis-data-{self.port}"

    def admin_headers(self) -> dict[str, str]:
        """What an admin write needs: the token `up` keeps in its data directory."""
        token = (self.data_dir / "api_key").read_text().strip()
        return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    @property
    def effective_redis_url(self) -> str:
        """Its Redis: the one given, else the embedded one, with the password `up` keeps in its data directory."""
        if self.redis_url:
            return self.redis_url
        password = ensure_redis_password(self.data_dir)  # (the one `up` takes, made here if it has not started)
        return f"redis://default:{password}@127.0.0.1:{self.redis_port}/0"

    def env(self) -> dict[str, str]:
        return marked_env(self.token, self.extra_env)

    def start(self, timeout_s: float = 60.0) -> Farm:
        """Launch `up` and wait for its banner."""
        proc = self.launch()
        try:
            wait_for(lambda: b"streamserve is up" in self.log() or proc.poll() is not None, timeout_s, "not up")
            assert proc.poll() is None, f"`up` exited with {proc.returncode}"
        except AssertionError as exc:
            self.stop()
            raise self.fail(f"farm did not come up ({exc})") from None
        return self

    def launch(self) -> subprocess.Popen[bytes]:
        """Start `up` in a session of its own, as a shell or a supervisor does, and return at once."""
        cmd = [self.command, "up", str(self.config), "--port", str(self.port)]
        # The data directory (the embedded Redis's data, the admin token) is beside the log, apart from every other
        # farm's.
        cmd += ["--data-dir", str(self.data_dir)]
        if self.redis_url:
            cmd += ["--redis-url", self.redis_url]
        else:
            cmd += ["--redis-port", str(self.redis_port)]
        cmd += self.extra_args
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=self.cwd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        return self.proc

    def log(self) -> bytes:
        return self.log_path.read_bytes() if self.log_path.exists() else b""

    def fail(self, why: str) -> AssertionError:
        """An error that says ``why``, with the end of `up`'s output."""
        return AssertionError(f"{why}:\n{self.log().decode(errors='replace')[-4000:]}")

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
        kill_marked(self.token)
        return code

    def processes(self) -> dict[int, list[str]]:
        """pid -> arguments of every live process the farm started (`up` itself included).

        Found by the marker, and as descendants of `up`: redis-server writes its title over its environment.
        """
        pids = set(pids_with_marker(self.token))
        if self.proc is not None:  # `up` by its pid too
            pids.update({self.proc.pid, *descendants(self.proc.pid)})
        found = {pid: command_line(pid) for pid in sorted(pids)}
        return {pid: argv for pid, argv in found.items() if argv}

    def role_pids(self) -> dict[str, list[int]]:
        """Role -> pids: ``gateway``, ``scheduler``, ``worker``, ``job-worker`` (``python -m streamserve ROLE``) and
        ``redis-server`` (the embedded Redis)."""
        roles: dict[str, list[int]] = {}
        for pid, argv in self.processes().items():
            role = role_of(argv)
            if role:
                roles.setdefault(role, []).append(pid)
        return roles

    def cli(self, *args: str, check: bool = True, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**self.env(), "REDIS_URL": self.effective_redis_url}
        result = subprocess.run(
            [self.command, *args], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"streamserve {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def status(self) -> dict[str, Any]:
        return {d["name"]: d for d in orjson.loads(self.cli("status", "--json").stdout)["deployments"]}

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=30, **kwargs)


def farm_on(config_text: str, workdir: Path, extra_env: Mapping[str, str] = FAST_HEARTBEATS) -> Farm:
    """A Farm (not started yet) on ``config_text``, written to a file in ``workdir`` beside its log."""
    config = workdir / "config.yaml"
    config.write_text(config_text)
    return Farm(config, workdir / "up.log", extra_env=extra_env)


@contextlib.contextmanager
def running_farm(
    config: Path, log_dir: Path, redis_url: str | None = None, extra_env: Mapping[str, str] = FAST_HEARTBEATS
) -> Iterator[Farm]:
    """``streamserve up CONFIG`` with every replica running at its target; stopped (and cleaned up) on exit."""
    farm = Farm(config, log_dir / "up.log", redis_url=redis_url, extra_env=extra_env)
    farm.start()
    try:
        wait_for(lambda: all(d["running"] == d["target"] for d in farm.status().values()), 60, "replicas not up")
        yield farm
    finally:
        farm.stop()


@contextlib.contextmanager
def running_farm_of(config_text: str, workdir: Path, extra_env: Mapping[str, str] = FAST_HEARTBEATS) -> Iterator[Farm]:
    """``running_farm`` of a config given as text (written to ``workdir/config.yaml``)."""
    config = workdir / "config.yaml"
    config.write_text(config_text)
    with running_farm(config, workdir, extra_env=extra_env) as farm:
        yield farm


@dataclass(frozen=True)
class Gateway:
    """A gateway process a test started (``name``, for ``Processes``): where it listens and where its output goes."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Processes:
    """streamserve commands started by a test; ``stop_all`` kills them and everything they started, by id.

    Their environment: ours without streamserve settings, plus ``REDIS_URL``, the tests' fast heartbeats and
    ``extra_env``.
    """

    def __init__(self, redis_url: str, log_dir: Path, extra_env: Mapping[str, str] | None = None) -> None:
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.extra_env = dict(extra_env or {})
        self.token = uuid.uuid4().hex
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def env(self) -> dict[str, str]:
        return marked_env(self.token, {"REDIS_URL": self.redis_url, **FAST_HEARTBEATS, **self.extra_env})

    def spawn(
        self,
        name: str,
        *args: str,
        preexec_fn: Callable[[], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run ``streamserve ARGS`` in the background (``env`` over its environment), logging to
        ``<log_dir>/<name>.log``."""
        with self.log(name).open("wb") as log:
            proc = subprocess.Popen(
                [STREAMSERVE, *args],
                cwd=ROOT,
                env={**self.env(), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=preexec_fn,
            )
        self.started[name] = proc
        return proc

    def start_gateway(self, *args: str, ready_path: str = "/-/ready", timeout_s: float = 30.0) -> Gateway:
        """``streamserve gateway ARGS`` on a free port, logging to ``gateway-PORT.log``; returns once ``ready_path``
        answers 200 (bounded), and fails with the gateway's output if it does not or the gateway exits."""
        port = free_port()
        name = f"gateway-{port}"
        proc = self.spawn(name, "gateway", "--port", str(port), *args)
        gateway = Gateway(name, proc, port, self.log(name))

        def ready_or_exited() -> bool:
            try:
                return httpx.get(gateway.url + ready_path, timeout=1).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        def output() -> str:
            return f"the gateway did not answer {ready_path}:\n{gateway.log.read_text()[-2000:]}"

        wait_for(ready_or_exited, timeout_s, output)
        assert proc.poll() is None, output()
        return gateway

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``streamserve ARGS`` to completion; raise with its output if it fails."""
        result = subprocess.run(
            [STREAMSERVE, *args], cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, f"streamserve {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def stop(self, name: str, timeout_s: float = 10.0) -> None:
        """SIGTERM what ``spawn`` started as ``name`` and wait (bounded) until it has exited; SIGKILL it if not.

        A graceful stop: a gateway flushes its figures at exit and stops its own workers.
        """
        proc = self.started[name]
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stop_all(self) -> None:
        kill_marked(self.token)
        for proc in self.started.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


@contextlib.contextmanager
def gateway_process(redis_url: str, log_dir: Path, *args: str, **env: str) -> Iterator[int]:
    """A real ``streamserve gateway`` process (uvicorn owns the connections) on a free port, ready; yields its port.

    ``args`` are extra command-line flags, ``env`` extra STREAMSERVE_* settings; its log is
    ``log_dir/gateway-PORT.log``. At the end it is stopped gracefully, then whatever it left is killed, by marker.
    """
    processes = Processes(redis_url, log_dir, extra_env=env)
    try:
        gateway = processes.start_gateway(*args, ready_path="/-/healthz")
        yield gateway.port
        processes.stop(gateway.name)
    finally:
        processes.stop_all()
