"""HTTP benchmark: the streamserve gateway (-> Redis -> one Echo replica) next to a bare FastAPI app doing the same.

Starts both, measures req/s and p50/p99 latency at concurrency 1 and 32 with a keep-alive HTTP/1.1
client written on raw asyncio streams (cheap enough to share two cores with the servers), stops
everything it started, and writes bench/RESULTS.md. Traffic goes to 127.0.0.1 only.

    .venv/bin/python bench/http_bench.py [--duration 10] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import math
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import uvloop

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
PATH = "/echo"
BODY = b'{"x":[1,2,3]}'
EXPECTED = {"echo": {"x": [1, 2, 3]}, "greeting": "hello"}
CONCURRENCIES = (1, 32)
CONFIG = f"""\
deployments:
  - name: echo
    import_path: examples.echo:Echo
    num_replicas: 1
    max_ongoing_requests: 32
    route_prefix: {PATH}
"""
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PHASE_GRACE_S = 10.0
"""A phase that has not ended this long after its deadline is cancelled; what was in flight counts as errors."""


# -- load generator --------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a fixed POST and reads Content-Length responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, bytes, bool]:
        """Write the request, return (status, body, server wants to close)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = -1
        close = False
        for line in head[:-4].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if length < 0:
            raise ValueError("response without Content-Length")
        return status, await self.reader.readexactly(length), close

    def close(self) -> None:
        self.writer.close()


def post_request(port: int, body: bytes = BODY) -> bytes:
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@dataclass
class Phase:
    """Counters of one timed phase, shared by its workers (one event loop: no locks)."""

    deadline: float
    max_requests: int
    started: int = 0
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


async def _worker(port: int, conns: list[Connection | None], i: int, phase: Phase) -> None:
    request = post_request(port)
    perf = time.perf_counter
    while phase.started < phase.max_requests and perf() < phase.deadline:
        phase.started += 1
        conn = conns[i]
        try:
            if conn is None:
                conn = conns[i] = await Connection.open(port)
            t0 = perf()
            status, _body, close = await conn.send(request)
            elapsed = perf() - t0
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            phase.errors += 1
            if conn is not None:
                conn.close()
            conns[i] = None
            await asyncio.sleep(0.01)  # the server is gone or broken: do not spin
            continue
        if status == 200:
            phase.ok += 1
            phase.latencies.append(elapsed)
        else:
            phase.errors += 1
        if close:
            conn.close()
            conns[i] = None


async def _run_phase(
    port: int, conns: list[Connection | None], seconds: float, max_requests: int
) -> tuple[Phase, float]:
    phase = Phase(time.perf_counter() + seconds, max_requests)
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(_worker(port, conns, i, phase)) for i in range(len(conns))]
    try:
        _done, stuck = await asyncio.wait(tasks, timeout=seconds + PHASE_GRACE_S)
        elapsed = time.perf_counter() - t0
    finally:  # also on Ctrl-C, which cancels us
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if stuck:
        phase.errors += phase.started - phase.ok - phase.errors  # what was still in flight
        for i, conn in enumerate(conns):
            if conn is not None:
                conn.close()
            conns[i] = None
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise RuntimeError("load worker failed") from task.exception()
    return phase, elapsed


@dataclass
class Result:
    target: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (nan when empty)."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


async def measure(
    target: str, port: int, concurrency: int, warmup_s: float, duration_s: float, max_requests: int
) -> Result:
    """Warm up, then measure, on the same ``concurrency`` keep-alive connections."""
    conns: list[Connection | None] = [None] * concurrency
    try:
        await _run_phase(port, conns, warmup_s, max_requests)
        phase, seconds = await _run_phase(port, conns, duration_s, max_requests)
    finally:
        for conn in conns:
            if conn is not None:
                conn.close()
    lat = sorted(phase.latencies)
    return Result(
        target, concurrency, phase.ok, phase.errors, seconds, 1000 * percentile(lat, 0.5), 1000 * percentile(lat, 0.99)
    )


async def probe(port: int) -> None:
    """One request whose answer must be 200 and exactly what Echo returns."""
    conn = await Connection.open(port)
    try:
        status, body, _ = await asyncio.wait_for(conn.send(post_request(port)), 10)
    finally:
        conn.close()
    if status != 200 or orjson.loads(body) != EXPECTED:
        raise RuntimeError(f"127.0.0.1:{port}{PATH} answered {status} {body[:200]!r}")


async def run_all(targets: dict[str, int], warmup_s: float, duration_s: float, max_requests: int) -> list[Result]:
    results = []
    for target, port in targets.items():
        await probe(port)
        for concurrency in CONCURRENCIES:
            result = await measure(target, port, concurrency, warmup_s, duration_s, max_requests)
            print(f"  {target:<11} c={concurrency:<3} {result.rps:>9.0f} req/s  errors {result.errors}", flush=True)
            results.append(result)
    return results


# -- processes -------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free now on 127.0.0.1."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]


def child_env() -> dict[str, str]:
    """Our environment without a Redis URL, so that `up` starts its embedded Redis."""
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAMSERVE_REDIS_URL")}


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
    print(f"bench: killing leftover process group {pid}: {command}", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class Farm:
    """`streamserve up CONFIG --port PORT` with its embedded Redis, as a child in its own session."""

    def __init__(self, config: Path, port: int, redis_port: int | None = None) -> None:
        cmd = [str(BIN / "streamserve"), "up", str(config), "--port", str(port)]
        if redis_port is not None:  # else `up` takes 6379 when it is free
            cmd += ["--redis-port", str(redis_port)]
        self.port = port
        self.redis_url = ""
        self.log: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._family: dict[int, bytes] = {}
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, name="farm-output", daemon=True).start()

    def _pump(self) -> None:
        """Keep reading the farm's output (a full pipe would block it) and hand lines to wait_ready."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())
            self._lines.put(line)
        self._lines.put(None)

    def _fail(self, why: str) -> RuntimeError:
        tail = "\n".join(self.log[-40:])
        return RuntimeError(f"streamserve up: {why}\n--- its output ---\n{tail}")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for "streamserve is up", then for every deployment to run its target replicas."""
        deadline = time.monotonic() + timeout_s
        up = False
        while not (up and self.redis_url):  # the banner: "streamserve is up", then "  redis     redis://..."
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self._fail(f"not up within {timeout_s:.0f}s") from None
            if line is None:
                raise self._fail(f"exited with code {self.proc.wait()}")
            parts = line.split()
            if parts[:1] == ["redis"] and len(parts) > 1:
                self.redis_url = parts[1]
            up = up or line.strip() == "streamserve is up"
        if not self.redis_url.startswith("redis://127.0.0.1:"):
            raise self._fail(f"unexpected Redis URL {self.redis_url!r}")
        status_cmd = [str(BIN / "streamserve"), "status", "--json", "--redis-url", self.redis_url]
        while True:
            out = subprocess.run(status_cmd, env=child_env(), capture_output=True, text=True, timeout=15, check=False)
            if out.returncode == 0:
                deployments = json.loads(out.stdout)["deployments"]
                if deployments and all(d["target"] >= 1 and d["running"] >= d["target"] for d in deployments):
                    break
            if self.proc.poll() is not None:
                raise self._fail(f"exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise self._fail(f"replicas not running within {timeout_s:.0f}s: {out.stdout or out.stderr}")
            time.sleep(0.2)
        self._family.update(descendants(self.proc.pid))

    def stop(self) -> None:
        """SIGINT `up` and wait (it stops what it started); SIGKILL its group, then any leftover child, if not."""
        self._family.update(descendants(self.proc.pid))
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"bench: streamserve up did not stop within {STOP_TIMEOUT_S:.0f}s; killing it", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        time.sleep(0.5)  # let orphaned children see their parent die (they get SIGTERM) before checking
        for pid, cmdline in self._family.items():
            kill_group_if_same(pid, cmdline)


class BareApp:
    """bench/bare_app.py on uvicorn, as a child in its own session."""

    def __init__(self, port: int) -> None:
        self.port = port
        cmd = [sys.executable, str(ROOT / "bench" / "bare_app.py"), "--port", str(port)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bare app exited with code {self.proc.returncode}")
            with socket.socket() as sock:
                if sock.connect_ex((HOST, self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"bare app not listening within {timeout_s:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


# -- report ----------------------------------------------------------------------------------------


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
    return commit + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def versions() -> str:
    names = {
        "fastapi": "fastapi",
        "uvicorn": "uvicorn",
        "uvloop": "uvloop",
        "httptools": "httptools",
        "redis-py": "redis",
    }
    found = [f"{label} {importlib.metadata.version(dist)}" for label, dist in names.items()]
    return ", ".join(
        [f"Python {platform.python_version()}", *found, f"redis-server {redis_server_version()} (embedded)"]
    )


def table(results: list[Result]) -> str:
    lines = [
        "| target | concurrency | req/s | p50 ms | p99 ms | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r.target} | {r.concurrency} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.errors} |"
        for r in results
    ]
    return "\n".join(lines)


def summary(results: list[Result]) -> list[str]:
    by = {(r.target, r.concurrency): r for r in results}
    ss32, bare32, ss1, bare1 = by["streamserve", 32], by["bare", 32], by["streamserve", 1], by["bare", 1]
    ratio = ss32.rps / bare32.rps if bare32.rps else math.nan
    return [
        f"- Throughput at c=32, streamserve / bare: **{ratio:.2f}** ({ss32.rps:.0f} vs {bare32.rps:.0f} req/s).",
        f"- p50 latency at c=1, streamserve - bare: **{ss1.p50_ms - bare1.p50_ms:+.2f} ms** "
        f"({ss1.p50_ms:.2f} vs {bare1.p50_ms:.2f} ms).",
    ]


def report(results: list[Result], args: argparse.Namespace, load: tuple[float, float, float]) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "# Benchmark results",
            "",
            "## HTTP echo: streamserve gateway vs bare FastAPI",
            "",
            f"Written by `bench/http_bench.py --duration {args.duration:g}` on {when}. One run on one machine, "
            "both targets side by side; see bench/README.md for what is measured.",
            "",
            f"- Machine: {os.cpu_count()} CPUs, {cpu_model()}, {platform.system()} {platform.release()}; "
            f"load average before the run {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
            f"- streamserve at git {git_revision()}. Versions: {versions()}.",
            f"- Load: `POST {PATH}` with `{BODY.decode()}`, HTTP/1.1 keep-alive, one connection per concurrent client, "
            f"{args.warmup:g} s warm-up then {args.duration:g} s (at most {args.max_requests} requests) per row; "
            "the client is one asyncio + uvloop process on the same machine.",
            "- streamserve: `streamserve up`, embedded Redis, deployment `echo` = `examples.echo:Echo`, 1 replica, "
            "max_ongoing_requests 32. bare: `bench/bare_app.py`, same uvicorn settings, no queue.",
            "",
            table(results),
            "",
            *summary(results),
            "",
        ]
    )


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="streamserve vs bare FastAPI, over HTTP on 127.0.0.1")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per row (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each row (default 2)")
    parser.add_argument("--max-requests", type=int, default=500_000, help="cap on requests per phase")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md", help="markdown file to write")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background (SIG_IGN)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM: same clean stop as Ctrl-C
    load = os.getloadavg()
    farm: Farm | None = None
    bare: BareApp | None = None
    with tempfile.TemporaryDirectory(prefix="streamserve-bench-") as tmp:
        try:
            config = Path(tmp) / "echo.yaml"
            config.write_text(CONFIG)
            farm_port, bare_port = free_ports(2)
            print(f"starting streamserve on {HOST}:{farm_port} and the bare app on {HOST}:{bare_port}", flush=True)
            farm = Farm(config, farm_port)
            bare = BareApp(bare_port)
            farm.wait_ready()
            bare.wait_ready()
            print(f"both up (Redis {farm.redis_url}); measuring", flush=True)
            targets = {"streamserve": farm_port, "bare": bare_port}
            results = uvloop.run(run_all(targets, args.warmup, args.duration, args.max_requests))
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
            if bare is not None:
                bare.stop()
            if farm is not None:
                farm.stop()
            signal.signal(signal.SIGINT, signal.default_int_handler)
    text = report(results, args, load)
    args.out.write_text(text)
    print()
    print(table(results))
    print()
    print("\n".join(summary(results)))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; what it started is stopped", file=sys.stderr)
        raise SystemExit(130) from None
