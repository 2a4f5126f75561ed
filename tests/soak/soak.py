"""A fault-injecting soak: a whole farm under mixed load for a set time, one fault after another.

    .venv/bin/python -m tests.soak.soak --minutes 30 [--fault-every 60] [--out FILE] [--redis-kill9]

It runs `streamserve up` (embedded Redis with its data directory) on free loopback ports with four
deployments (fast over HTTP, fast through the Python client, slow, autoscaled) and its job workers, and
sends a bounded mixed load: HTTP calls, client calls, asynchronous jobs, slow calls, autoscaled calls.
Every ``--fault-every`` seconds it injects the next fault in turn: kill -9 of a replica, of the scheduler,
of the gateway, a Redis restart (SIGTERM, or SIGKILL with ``--redis-kill9``); `up` restarts the last three.

Every request carries a unique id, and every execution appends it, its pid and the time to a ledger file
(tests/soak/deployments.py), so the report counts: sent, answered correctly, answered with an error (by kind),
lost (no answer by its deadline, or a job that never reached a final status), executions more than once (among
callers that got a correct answer: the goal is none; and among the others; each listed with who ran it when),
and, apart, requests run again because the replica that ran them was killed before it replied (delivery is at
least once). It samples the RSS of every process of the farm and Redis's used_memory every ``SAMPLE_EVERY_S``.
Exit code 0 when nothing was lost and no caller that got a correct answer saw its request run twice; if it
fails, the farm's log is kept beside ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

from streamserve.client import Client
from streamserve.wire.errors import StreamServeError
from tests.harness.farm import Farm, role_of
from tests.harness.paths import python_path
from tests.harness.waiting import wait_for

CONFIG = """
deployments:
  - {name: fast, import_path: 'tests.soak.deployments:record', num_replicas: 2, max_ongoing_requests: 8,
     route_prefix: /fast, graceful_shutdown_timeout_s: 5}
  - {name: direct, import_path: 'tests.soak.deployments:record', num_replicas: 1, route_prefix: null,
     graceful_shutdown_timeout_s: 5}
  - {name: slow, import_path: 'tests.soak.deployments:record_slowly', num_replicas: 2, max_ongoing_requests: 4,
     route_prefix: /slow, graceful_shutdown_timeout_s: 10}
  - name: auto
    import_path: 'tests.soak.deployments:record_slowly'
    route_prefix: /auto
    max_ongoing_requests: 2
    graceful_shutdown_timeout_s: 5
    autoscaling_config: {min_replicas: 1, max_replicas: 3, target_ongoing_requests: 1,
                         upscale_delay_s: 2, downscale_delay_s: 10}
"""
FAULTS = ("replica", "scheduler", "gateway", "redis")
DEADLINE_S = 30.0  # every call's deadline (X-Request-Timeout / the client's timeout)
MARGIN_S = 10.0  # an answer this long after the deadline still counts; later (or none) is lost
JOB_FINAL_WAIT_S = 90.0  # after the load stops, how long jobs may take to reach a final status
SAMPLE_EVERY_S = 10.0
# (name, deployment, pause between calls in s): each a thread of sequential calls; ~100 calls/s in all.
# Two callers without pause keep about two requests in flight on "auto": it scales to two replicas or more.
HTTP_LOADS = (
    ("http", "fast", 0.02),
    ("http", "fast", 0.02),
    ("slow", "slow", 0.0),
    ("auto", "auto", 0.0),
    ("auto", "auto", 0.0),
)


@dataclass
class Outcome:
    kind: str  # http, client, slow, auto, job
    request_id: str
    sent_s: float
    result: str = ""  # "ok", an error kind ("503 RedisUnavailableError", "connection error", ...), or "lost"


@dataclass
class Ledger:
    """What the load sent and how each call ended; thread-safe appends."""

    directory: Path
    outcomes: list[Outcome] = field(default_factory=list)
    jobs: dict[str, Outcome] = field(default_factory=dict)  # job id -> its outcome (filled when final)
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def new(self, kind: str) -> Outcome:
        with self._lock:
            outcome = Outcome(kind, f"{kind}-{next(self._ids)}", time.monotonic())
            self.outcomes.append(outcome)
        return outcome

    def body(self, outcome: Outcome, **extra: Any) -> dict[str, Any]:
        return {"id": outcome.request_id, "ledger": str(self.directory), **extra}

    def executions(self) -> dict[str, list[tuple[int, float]]]:
        """Request id -> (pid, time) of each run of it, in the order they ran."""
        runs: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for path in self.directory.glob("*.txt"):
            pid = int(path.stem)
            for line in path.read_text().splitlines():
                request_id, at = line.split()
                runs[request_id].append((pid, float(at)))
        for each in runs.values():
            each.sort(key=lambda run: run[1])
        return runs


def http_error(response: httpx.Response) -> str:
    try:
        return f"{response.status_code} {orjson.loads(response.content).get('error', '?')}"
    except (orjson.JSONDecodeError, AttributeError):
        return f"{response.status_code} (no JSON body)"


def http_load(base_url: str, ledger: Ledger, kind: str, deployment: str, pause_s: float, stop: threading.Event) -> None:
    rng = random.Random(kind + deployment)
    with httpx.Client(timeout=DEADLINE_S + MARGIN_S) as http:
        while not stop.is_set():
            outcome = ledger.new(kind)
            extra = {"sleep": rng.uniform(0.5, 2.0)} if deployment == "slow" else {}
            extra = {"sleep": rng.uniform(0.05, 0.3)} if deployment == "auto" else extra
            try:
                response = http.post(
                    f"{base_url}/{deployment}",
                    json=ledger.body(outcome, **extra),
                    headers={"X-Request-Timeout": str(DEADLINE_S)},
                )
                if response.status_code == 200 and response.json() == {"id": outcome.request_id}:
                    outcome.result = "ok"
                elif response.status_code == 200:
                    outcome.result = "200 with a wrong body"
                else:
                    outcome.result = http_error(response)
            except httpx.TimeoutException:
                outcome.result = "lost"
            except httpx.HTTPError as exc:
                outcome.result = f"connection error ({type(exc).__name__})"
                stop.wait(0.2)  # the gateway is being restarted
            stop.wait(pause_s)


def client_load(redis_url: str, ledger: Ledger, stop: threading.Event) -> None:
    with Client(redis_url) as client:
        while not stop.is_set():
            outcome = ledger.new("client")
            try:
                answer = client.call("direct", ledger.body(outcome), timeout=DEADLINE_S)
                outcome.result = "ok" if answer == {"id": outcome.request_id} else "wrong answer"
            except StreamServeError as exc:
                outcome.result = f"client {type(exc).__name__}"
                stop.wait(0.2)
            stop.wait(0.05)


def job_load(base_url: str, ledger: Ledger, stop: threading.Event) -> None:
    """Submits a job every 0.5 s; the job's outcome is settled by ``settle_jobs`` at the end."""
    with httpx.Client(timeout=DEADLINE_S) as http:
        while not stop.is_set():
            outcome = ledger.new("job")
            try:
                response = http.post(f"{base_url}/fast", json=ledger.body(outcome), headers={"Prefer": "respond-async"})
                if response.status_code == 202:
                    ledger.jobs[response.json()["job_id"]] = outcome
                else:
                    outcome.result = f"submit {http_error(response)}"
            except httpx.HTTPError as exc:
                outcome.result = f"submit connection error ({type(exc).__name__})"
            stop.wait(0.5)


def settle_jobs(redis_url: str, ledger: Ledger) -> None:
    """Wait (bounded) for every accepted job to finish or fail; those that never do are lost."""
    deadline = time.monotonic() + JOB_FINAL_WAIT_S
    with Client(redis_url) as client:
        open_jobs = dict(ledger.jobs)
        while open_jobs and time.monotonic() < deadline:
            for job_id, outcome in list(open_jobs.items()):
                try:
                    info = client.job(job_id)
                except StreamServeError as exc:  # 404: gone before it ended
                    outcome.result = f"job {type(exc).__name__}"
                    del open_jobs[job_id]
                    continue
                if info.status.value == "finished":
                    outcome.result = "ok" if info.result == {"id": outcome.request_id} else "job wrong result"
                    del open_jobs[job_id]
                elif info.status.value == "failed":
                    outcome.result = f"job failed {(info.error or {}).get('error', '?')}"
                    del open_jobs[job_id]
            time.sleep(0.5)
        for outcome in open_jobs.values():
            outcome.result = "lost"


class Faults:
    """Injects the next fault in turn into the farm; remembers when and what."""

    def __init__(self, farm: Farm, kill9_redis: bool) -> None:
        self.farm = farm
        self.kill9_redis = kill9_redis
        self.log: list[tuple[float, str]] = []
        self.killed_replicas: set[int] = set()  # pids of replicas sent SIGKILL
        self.started_s, self.started_at = time.monotonic(), time.time()  # reset when the load starts
        self._next = itertools.cycle(FAULTS)

    def inject(self, now_s: float) -> None:
        fault = next(self._next)
        roles = self.farm.role_pids()
        pids = {
            "replica": roles.get("worker", []),
            "scheduler": roles.get("scheduler", []),
            "gateway": roles.get("gateway", []),
            "redis": roles.get("redis-server", []),
        }[fault]
        if not pids:
            self.log.append((now_s, f"{fault}: no process to hit"))
            return
        pid = random.choice(pids)
        sig = signal.SIGTERM if fault == "redis" and not self.kill9_redis else signal.SIGKILL
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            self.log.append((now_s, f"{fault}: pid {pid} was gone already"))
            return
        if fault == "replica":
            self.killed_replicas.add(pid)
        self.log.append((now_s, f"{fault}: {sig.name} to pid {pid}"))
        print(f"soak: {now_s:7.1f}s  {fault}: {sig.name} to pid {pid}", flush=True)


def deployments(farm: Farm) -> list[dict[str, Any]]:
    """Every deployment's status, or none while the farm cannot tell (a fault is being recovered from)."""
    try:
        return list(farm.status().values())
    except AssertionError:
        return []


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample_memory(farm: Farm) -> dict[str, int]:
    """KiB by role: the sum over that role's processes (replicas: per deployment), and Redis's used_memory;
    ``"<role> processes"``: how many there were."""
    sample: dict[str, int] = defaultdict(int)
    for pid, argv in farm.processes().items():
        role = "up" if pid == (farm.proc.pid if farm.proc else -1) else None
        if role is None:
            role = role_of(argv) or "other"
            if role == "worker" and len(argv) > 4:
                role = f"replicas of {argv[4]}"
        sample[role] += rss_kib(pid)
        sample[f"{role} processes"] += 1
    try:
        client = redis.Redis.from_url(farm.effective_redis_url, socket_timeout=2)
        sample["redis used_memory"] = int(client.info("memory")["used_memory"]) // 1024
        client.close()
    except redis.RedisError:
        pass
    return dict(sample)


def run(minutes: float, fault_every_s: float, kill9_redis: bool, failed_log: Path | None = None) -> tuple[str, bool]:
    """The report and whether the soak passed; ``failed_log``: where to copy the farm's log if it did not.

    The farm runs with `up`'s own heartbeats (not the tests' fast ones); it is stopped, and everything it started
    killed, however this ends.
    """
    with tempfile.TemporaryDirectory(prefix="streamserve-soak-") as tmp:
        workdir = Path(tmp)
        ledger_dir = workdir / "ledger"
        ledger_dir.mkdir()
        config = workdir / "soak.yaml"
        config.write_text(CONFIG)
        farm = Farm(config, workdir / "up.log", extra_env={"PYTHONPATH": python_path()})
        try:
            return soak_farm(farm, ledger_dir, minutes, fault_every_s, kill9_redis, failed_log)
        finally:
            farm.stop()


def soak_farm(
    farm: Farm, ledger_dir: Path, minutes: float, fault_every_s: float, kill9_redis: bool, failed_log: Path | None
) -> tuple[str, bool]:
    """Start ``farm``, load it and inject faults for ``minutes``, let it settle, stop it; the report."""
    farm.start(120)

    def every_deployment_running() -> bool:
        ds = deployments(farm)
        return ds != [] and all(d["running"] >= 1 for d in ds)

    wait_for(every_deployment_running, 120, "not every deployment ran a replica", interval_s=0.5)
    ledger = Ledger(ledger_dir)
    faults = Faults(farm, kill9_redis)
    stop = threading.Event()
    loads: list[Callable[[], None]] = [
        *(functools.partial(http_load, farm.base_url, ledger, k, d, p, stop) for k, d, p in HTTP_LOADS),
        functools.partial(client_load, farm.effective_redis_url, ledger, stop),
        functools.partial(job_load, farm.base_url, ledger, stop),
    ]
    threads = [threading.Thread(target=load, daemon=True) for load in loads]
    started = time.monotonic()
    faults.started_s, faults.started_at = started, time.time()
    samples: list[tuple[float, dict[str, int]]] = [(0.0, sample_memory(farm))]
    for thread in threads:
        thread.start()
    next_fault, next_sample, end = fault_every_s, SAMPLE_EVERY_S, minutes * 60
    try:
        while (now := time.monotonic() - started) < end:
            if farm.proc is None or farm.proc.poll() is not None:
                raise RuntimeError(f"`streamserve up` exited; its log:\n{farm.log().decode()[-4000:]}")
            if now >= next_fault:
                faults.inject(now)
                next_fault += fault_every_s
            if now >= next_sample:
                samples.append((now, sample_memory(farm)))
                next_sample += SAMPLE_EVERY_S
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(DEADLINE_S + MARGIN_S + 5)
    samples.append((time.monotonic() - started, sample_memory(farm)))
    settle_jobs(farm.effective_redis_url, ledger)

    def all_idle() -> bool:
        ds = deployments(farm)
        return ds != [] and all(d["queued"] + d["in_flight"] == 0 for d in ds)

    # Let what is still queued or running finish before counting executions (a run that does not is counted
    # as it is: what never ran shows as lost).
    try:
        wait_for(all_idle, 60, "queued or running requests left")
    except AssertionError as exc:
        print(f"soak: {exc}", flush=True)
    farm.stop(60)
    text, good = report(ledger, faults, samples, minutes, fault_every_s)
    if not good and failed_log is not None:
        shutil.copyfile(farm.log_path, failed_log)
    return text, good


def report(
    ledger: Ledger, faults: Faults, samples: list[tuple[float, dict[str, int]]], minutes: float, every_s: float
) -> tuple[str, bool]:
    runs = ledger.executions()
    outcomes = [o for o in ledger.outcomes if o.result]  # a call cut off by the stop itself has none
    ok = [o for o in outcomes if o.result == "ok"]
    lost = [o for o in outcomes if o.result == "lost"]
    errors = Counter(o.result for o in outcomes if o.result not in ("ok", "lost"))
    # At least once: a replica killed after running a request but before its reply went out had it run again.
    again = [o for o in outcomes if len(runs.get(o.request_id, ())) > 1]
    rerun = [o for o in again if all(pid in faults.killed_replicas for pid, _ in runs[o.request_id][:-1])]
    twice_ok = [o for o in again if o.result == "ok" and o not in rerun]
    twice_err = [o for o in again if o.result not in ("ok", "lost") and o not in rerun]
    never_ok = [o for o in ok if not runs.get(o.request_id)]
    by_kind = Counter(o.kind for o in outcomes)
    lines = [
        f"## Soak: {minutes:g} min, a fault every {every_s:g} s",
        "",
        f"- sent: {len(outcomes)} ({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))})",
        f"- answered correctly: {len(ok)}",
        f"- answered with an error: {sum(errors.values())}",
        *(f"  - {kind}: {n}" for kind, n in errors.most_common()),
        f"- lost (no answer by the deadline + {MARGIN_S:g} s, or a job never final): {len(lost)}",
        f"- run more than once, among correct answers: {len(twice_ok)}; among errors: {len(twice_err)}",
        *(f"  - {line}" for line in _duplicates(twice_ok + twice_err, runs, faults)),
        f"- run again because the replica that ran it was killed before it replied (at least once): {len(rerun)}",
        *(f"  - {line}" for line in _duplicates(rerun, runs, faults)),
        f"- answered correctly but never run (impossible unless the ledger lies): {len(never_ok)}",
        "",
        "Faults:",
        "",
        *(f"- {at:7.1f} s  {what}" for at, what in faults.log),
        "",
        f"Memory (KiB; RSS summed by role, and Redis's used_memory), sampled every {SAMPLE_EVERY_S:g} s:",
        "",
        "| process | first | last | max | processes, first -> last |",
        "|---|---:|---:|---:|---|",
    ]
    roles = sorted({role for _t, sample in samples for role in sample if not role.endswith(" processes")})
    for role in roles:
        values = [sample.get(role, 0) for _t, sample in samples]
        counts = [sample.get(f"{role} processes", 0) for _t, sample in samples]
        count = f"{counts[0]} -> {counts[-1]}" if role != "redis used_memory" else ""
        lines.append(f"| {role} | {values[0]:,} | {values[-1]:,} | {max(values):,} | {count} |")
    return "\n".join(lines) + "\n", not lost and not twice_ok and not never_ok


def _duplicates(twice: list[Outcome], runs: dict[str, list[tuple[int, float]]], faults: Faults) -> list[str]:
    """Which processes ran each request run more than once, and when (the first 20); a replica killed is marked."""
    return [
        f"{o.request_id} ({o.result}, sent at {o.sent_s - faults.started_s:.1f} s): run by "
        + ", ".join(
            f"pid {pid}{' (killed)' if pid in faults.killed_replicas else ''} at {at - faults.started_at:.1f} s"
            for pid, at in runs[o.request_id]
        )
        for o in twice[:20]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    parser.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults (default 60)")
    parser.add_argument("--redis-kill9", action="store_true", help="restart Redis with SIGKILL, not SIGTERM")
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the report to this file (and the farm's log beside it, X.up.log, if it fails)",
    )
    args = parser.parse_args(argv)
    failed_log = args.out.with_suffix(".up.log") if args.out is not None else None
    text, good = run(args.minutes, args.fault_every, args.redis_kill9, failed_log)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        if not good:
            print(f"soak: the farm's log is in {failed_log}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
