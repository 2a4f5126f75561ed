"""The scheduler at scale: one real scheduler against a real Redis, 100 deployments of 10, 100 and 1,000 simulated
replicas each (1,000 to 100,000 replicas).

    .venv/bin/python -m bench.scale_sim [--quick] [--out FILE]
    SCALE_SIM_SIZES=1000 STREAMSERVE_HEARTBEAT_INTERVAL_S=2.5 STREAMSERVE_HEARTBEAT_TIMEOUT_S=10 \
        .venv/bin/python -m bench.scale_sim      # one size, slower heartbeats

No replica process runs. The scheduler (the real ``Scheduler``, in a process of its own, with a launcher that
starts nothing and answers "alive" for what it started) runs its ordinary loop; one heartbeat writer process
writes every simulated replica's heartbeat once a second, as replicas do, in one pipeline. At each size, once
every replica is RUNNING, it measures over a window:

- tick duration (p50, p99), timed inside the scheduler process;
- Redis commands per tick (INFO commandstats, less what the heartbeat writer reports it sent) and bytes per tick
  (what the scheduler's sockets sent and received, from ``ss -tinp``);
- scheduler CPU and Redis CPU (with the heartbeats: the load the replicas themselves would put on Redis), as a
  fraction of one core;
- Redis memory per replica and per deployment (INFO used_memory, fitted over the sizes);
- one config change (a deployment's user_config) to 1,000 long-poll subscribers in 4 processes (p50, p99);
- 1,000 replicas going silent, each holding one request: the time until the scheduler has written them off and
  re-queued every request (the heartbeat timeout, 5 s, is part of it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.children import Child, Children
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.standalone import standalone
from bench.stats import percentile
from streamserve.control.desired_state import DesiredState
from streamserve.control.heartbeats import queue_beats
from streamserve.control.long_poll import EVERYTHING, LongPollSubscriber
from streamserve.runtime.embedded_redis import redis_server_binary
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.scheduler.main import serve
from streamserve.scheduler.scheduler import Scheduler
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.ids import ReplicaID
from streamserve.wire.keys import CONSUMER_GROUP, ConfigKey, Keys
from streamserve.wire.messages import Heartbeat, Request, now_ms
from streamserve.wire.states import ReplicaState
from tests.harness.paths import python_path
from tests.harness.waiting import wait_for

DEPLOYMENTS = 100
SIZES = (10, 100, 1000)
QUICK_SIZES = (10, 100)
WINDOW_S = 20.0
QUICK_WINDOW_S = 8.0
SUBSCRIBERS = 1000
LISTENER_PROCESSES = 4
PUSHES = 20
QUICK_PUSHES = 10
DEAD = 1000
# The farm's heartbeat settings, from the environment as every process reads them (STREAMSERVE_HEARTBEAT_*).
BEAT_INTERVAL_S = Settings().heartbeat_interval_s
HEARTBEAT_TIMEOUT_S = Settings().heartbeat_timeout_s
RAMP_TIMEOUT_S = 600.0
DEAD_TIMEOUT_S = 120.0

# The simulation's own keys, beside the farm's.
TICKS = "bench:scale:ticks"  # list: each tick's duration in ms, pushed by the scheduler
RUNNING = "bench:scale:running"  # string: how many replicas the scheduler holds RUNNING
SILENCED = "bench:scale:silenced"  # set: replica ids whose heartbeats the writer stops
HOLD = "bench:scale:hold"  # string: while set, the writer does not re-read the replica records
WRITER = "bench:scale:writer"  # hash: command -> how many the heartbeat writer has sent
ARRIVALS = "bench:scale:arrivals"  # list: each listener process's arrival times, JSON

KEYS = Keys()
HOST = socket.gethostname()
TARGETS = {"tick p99 at 10,000 replicas": 200.0, "tick p99 at 100,000 replicas": 1000.0, "config push p99": 100.0}


def names(count: int = DEPLOYMENTS) -> list[str]:
    return [f"sim{i}" for i in range(count)]


# -- the scheduler process -----------------------------------------------------------------------------


class SimLauncher:
    """Starts nothing: a "process" lives from ``start`` until it is told to stop."""

    host = HOST

    def __init__(self) -> None:
        self._pids = itertools.count(100_000)
        self._alive: dict[int, ReplicaID] = {}

    def start(self, replica_id: ReplicaID, gpus: tuple[str, ...] = ()) -> int:
        pid = next(self._pids)
        self._alive[pid] = replica_id
        return pid

    def find(self, replica_id: ReplicaID) -> int | None:
        return None

    def is_alive(self, pid: int, replica_id: ReplicaID) -> bool:
        return self._alive.get(pid) == replica_id

    def is_stopped(self, pid: int) -> bool:
        return False

    def exit_code(self, pid: int) -> int | None:
        return None if pid in self._alive else 0

    def terminate(self, pid: int, replica_id: ReplicaID) -> None:
        self._alive.pop(pid, None)

    def kill(self, pid: int, replica_id: ReplicaID) -> None:
        self._alive.pop(pid, None)

    def forget(self, pid: int) -> None:
        self._alive.pop(pid, None)


class TimedScheduler(Scheduler):
    """The real scheduler; each tick's duration goes to TICKS, and now and then its RUNNING count to RUNNING."""

    async def tick(self) -> None:
        started = time.perf_counter()
        await super().tick()
        elapsed_ms = (time.perf_counter() - started) * 1000
        await self._redis.rpush(TICKS, f"{elapsed_ms:.3f}")
        if self.ticks % 5 == 0:
            running = sum(s.count(ReplicaState.RUNNING) for s in self._states.values())
            await self._redis.set(RUNNING, running)


async def run_scheduler(url: str) -> None:
    """As ``streamserve scheduler`` runs it (scheduler/main.py), with the launcher above."""
    settings = Settings(redis_url=url, check_redis=False, job_workers=0)
    client = async_redis(url)
    await serve(TimedScheduler(settings, client, SimLauncher()), client)


# -- the heartbeat writer ------------------------------------------------------------------------------


async def run_beats(url: str) -> None:
    """Every BEAT_INTERVAL_S, one pipeline: a heartbeat for each STARTING or RUNNING replica, written as replicas
    write theirs (src/streamserve/control/heartbeats.py), a deployment's in one HSET and one ZADD."""
    client = async_redis(url)
    sent: Counter[str] = Counter()
    beating: dict[str, list[tuple[str, int, str]]] = {}
    silenced: set[bytes] = set()
    told: set[str] = set()  # replicas beaten at least once
    reread_at = 0.0
    sample = {"ts_ms": 0, "health": "ready", "pid": 1, "host": HOST, "ongoing": 0, "message": "", "version": "v"}
    Heartbeat.decode(orjson.dumps(sample))  # the writer's heartbeats are what the scheduler reads
    while True:
        started = time.monotonic()
        if started >= reread_at and not await client.get(HOLD):
            async with client.pipeline(transaction=False) as pipe:
                for name in names():
                    pipe.hgetall(KEYS.replicas(name))
                pipe.smembers(SILENCED)
                *records, silenced = await pipe.execute()
            sent.update(hgetall=DEPLOYMENTS, smembers=1, get=1)
            beating = {}
            for name, raw in zip(names(), records, strict=True):
                beating[name] = [
                    (r["replica_id"], r["pid"], r["version"])
                    for r in map(orjson.loads, raw.values())
                    if r["state"] in ("STARTING", "RUNNING")
                ]
            reread_at = started + 5.0
        else:  # every beat: a replica silenced now stops beating now, so "re-queued after" times the scheduler alone
            sent.update(get=int(started >= reread_at), smembers=1)
            silenced = await client.smembers(SILENCED)
        ts = now_ms()
        async with client.pipeline(transaction=False) as pipe:
            for name, replicas in beating.items():
                beats = {
                    rid: (ts, orjson.dumps({**sample, "ts_ms": ts, "pid": pid, "version": version}))
                    for rid, pid, version in replicas
                    if rid.encode() not in silenced
                }
                if beats:
                    news = not beats.keys() <= told  # a replica's first beat says it is ready: news
                    told.update(beats)
                    queue_beats(pipe, KEYS, name, beats, news)
                    sent.update(hset=1, zadd=1, incr=int(news))
            sent.update(hset=1)
            pipe.hset(WRITER, mapping=dict(sent))  # type: ignore[arg-type]
            await pipe.execute()
        await asyncio.sleep(max(0.0, BEAT_INTERVAL_S - (time.monotonic() - started)))


# -- a long-poll listener process ----------------------------------------------------------------------


async def run_listener(url: str, count: int, changes: int) -> None:
    """``count`` LongPollSubscribers (one pub/sub connection each); when each has heard ``changes`` changes of the
    deployments, or after a bound, push every subscriber's arrival times (wall clock) to ARRIVALS."""
    client = async_redis(url, max_connections=count + 16)
    arrivals: list[list[float]] = [[] for _ in range(count)]
    subscribers = []
    for i in range(count):

        async def on_change(changed: set[str], seen: list[float] = arrivals[i]) -> None:
            if EVERYTHING not in changed and ConfigKey.DEPLOYMENTS in changed:
                seen.append(time.time())

        subscribers.append(
            LongPollSubscriber(client, KEYS, lambda key: key == ConfigKey.DEPLOYMENTS, on_change, resync_interval_s=60)
        )
    try:
        await asyncio.gather(*(s.start() for s in subscribers))
        print("listening", flush=True)
        deadline = time.monotonic() + 60 + changes * 2
        while any(len(a) < changes for a in arrivals) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await client.rpush(ARRIVALS, orjson.dumps(arrivals))
    finally:
        await asyncio.gather(*(s.close() for s in subscribers))
        await client.aclose()


# -- the run -------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def socket_bytes(pid: int) -> int:
    """Bytes sent and received so far on the process's open TCP sockets (``ss -tinp``): its Redis traffic."""
    lines = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    total = 0
    for line, details in itertools.pairwise(lines):
        if f"pid={pid}," in line:
            fields = dict(f.split(":", 1) for f in details.split() if f.startswith(("bytes_sent:", "bytes_received:")))
            total += int(fields.get("bytes_sent", 0)) + int(fields.get("bytes_received", 0))
    return total


def command_calls(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(f["calls"]) for name, f in stats.items()})


def role(name: str, url: str, *args: str) -> Child:
    cmd = [sys.executable, "-m", "bench.scale_sim", name, url, *args]
    return Child(name, cmd, env={**os.environ, "PYTHONPATH": python_path()})


async def deploy(url: str, replicas: int, generation: int = 0) -> None:
    client = async_redis(url)
    try:
        configs = [
            DeploymentConfig.model_validate(
                {"name": name, "import_path": "examples.functions:noop", "num_replicas": replicas}
                | ({"user_config": {"generation": generation}} if generation else {})
            )
            for name in names()
        ]
        await DesiredState(client, KEYS).apply(AppConfig(deployments=configs))
    finally:
        await client.aclose()


def push_config(url: str, client: redis.Redis, children: Children, changes: int, size: int) -> list[float]:
    """``changes`` user_config changes of one deployment, 0.5 s apart; each subscriber's delay for each, in ms."""
    client.delete(ARRIVALS)
    listeners = [
        children.start(role("listen", url, str(SUBSCRIBERS // LISTENER_PROCESSES), str(changes)))
        for _ in range(LISTENER_PROCESSES)
    ]
    for listener in listeners:
        listener.wait_for_line("listening", 120)
    channel = KEYS.config_channel()
    wait_for(lambda: client.pubsub_numsub(channel)[0][1] >= SUBSCRIBERS, 60, "not every subscriber subscribed", 0.1)
    time.sleep(1.0)  # let the subscribe confirmations' own syncs pass
    starts = []
    cfg = {"name": "sim0", "import_path": "examples.functions:noop", "num_replicas": size}
    for k in range(changes):
        starts.append(time.time())
        asyncio.run(_apply_one(url, {**cfg, "user_config": {"push": k}}))
        time.sleep(0.5)
    wait_for(lambda: client.llen(ARRIVALS) >= LISTENER_PROCESSES, 120, "not every listener reported", 0.5)
    delays, missing = [], 0
    for raw in client.lrange(ARRIVALS, 0, -1):
        for seen in orjson.loads(raw):
            for k, t0 in enumerate(starts):
                t1 = starts[k + 1] if k + 1 < len(starts) else float("inf")
                hits = [t for t in seen if t0 <= t < t1]
                if hits:
                    delays.append((min(hits) - t0) * 1000)
                else:
                    missing += 1
    for listener in listeners:
        listener.stop()
    if missing:
        print(f"scale_sim: {missing} subscriber(s) x change(s) never heard", file=sys.stderr)
    return sorted(delays)


async def _apply_one(url: str, cfg: dict[str, Any]) -> None:
    client = async_redis(url)
    try:
        await DesiredState(client, KEYS).apply(AppConfig(deployments=[DeploymentConfig.model_validate(cfg)]))
    finally:
        await client.aclose()


def silence_and_requeue(client: redis.Redis) -> float:
    """DEAD running replicas each take one request, then go silent; seconds until all their requests are back in
    their streams, re-queued by the scheduler."""
    per = DEAD // DEPLOYMENTS
    victims: dict[str, list[str]] = {}
    for name in names():
        records = [orjson.loads(v) for v in client.hgetall(KEYS.replicas(name)).values()]
        victims[name] = [r["replica_id"] for r in records if r["state"] == "RUNNING"][:per]
    pipe = client.pipeline(transaction=False)
    for name, rids in victims.items():
        stream = KEYS.requests(name)
        for i, _rid in enumerate(rids):
            request = Request(f"dead-{name}-{i}", "", now_ms() + 600_000, b"null")
            pipe.xadd(stream, request.encode())  # type: ignore[arg-type]
        for rid in rids:
            pipe.xreadgroup(CONSUMER_GROUP, rid, {stream: ">"}, count=1)
    pipe.execute()

    def pending() -> int:
        p = client.pipeline(transaction=False)
        for name in names():
            p.xpending(KEYS.requests(name), CONSUMER_GROUP)
        return sum(int(summary["pending"]) for summary in p.execute())

    held = pending()
    assert held == sum(map(len, victims.values())), f"{held} pending, expected {DEAD}"
    client.sadd(SILENCED, *[rid for rids in victims.values() for rid in rids])
    return wait_for(lambda: pending() == 0, DEAD_TIMEOUT_S, "the dead replicas' requests were not re-queued", 0.05)


def measure_size(url: str, redis_pid: int, size: int, opts: Options, children: Children) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    baseline = int(client.info("memory")["used_memory"])
    asyncio.run(deploy(url, size))
    scheduler = children.start(role("scheduler", url))
    beats = children.start(role("beats", url))
    total = DEPLOYMENTS * size
    ramp_s = wait_for(
        lambda: int(client.get(RUNNING) or 0) >= total, RAMP_TIMEOUT_S, f"not {total:,} replicas RUNNING", 1.0
    )
    client.set(HOLD, 1)  # the writer keeps beating the replicas it knows, without re-reading their records
    time.sleep(3.0)  # past the last re-read
    window_s = QUICK_WINDOW_S if opts.quick else WINDOW_S
    client.delete(TICKS)
    calls0, writer0 = command_calls(client), Counter({k.decode(): int(v) for k, v in client.hgetall(WRITER).items()})
    cpu0 = {"scheduler": cpu_seconds(scheduler.pid), "redis": cpu_seconds(redis_pid), "beats": cpu_seconds(beats.pid)}
    io0 = socket_bytes(scheduler.pid)
    time.sleep(window_s)
    ticks_ms = sorted(float(t) for t in client.lrange(TICKS, 0, -1))
    io1 = socket_bytes(scheduler.pid)
    cpu = {
        k: (cpu_seconds(pid) - cpu0[k]) / window_s
        for k, pid in (("scheduler", scheduler.pid), ("redis", redis_pid), ("beats", beats.pid))
    }
    calls = command_calls(client) - calls0
    writer = Counter({k.decode(): int(v) for k, v in client.hgetall(WRITER).items()}) - writer0
    memory = int(client.info("memory")["used_memory"]) - baseline
    n = len(ticks_ms)
    ours = {"info": calls["info"], "rpush": n, "set": n // 5 + 1, "llen": 0, "lrange": 1, "hgetall": 1, "delete": 1}
    scheduler_calls = calls - writer - Counter(ours)
    pushes = push_config(url, client, children, QUICK_PUSHES if opts.quick else PUSHES, size)
    client.delete(HOLD)
    dead_s = silence_and_requeue(client)
    scheduler.stop()
    beats.stop()
    client.close()
    return {
        "replicas": total,
        "ramp_s": ramp_s,
        "ticks": n,
        "tick_p50_ms": percentile(ticks_ms, 0.5),
        "tick_p99_ms": percentile(ticks_ms, 0.99),
        "commands_per_tick": sum(scheduler_calls.values()) / max(n, 1),
        "top_commands": {k: v / max(n, 1) for k, v in scheduler_calls.most_common(6)},
        "bytes_per_tick": (io1 - io0) / max(n, 1),
        "cpu": cpu,
        "memory_bytes": memory,
        "push_p50_ms": percentile(pushes, 0.5),
        "push_p99_ms": percentile(pushes, 0.99),
        "pushes": len(pushes),
        "dead_s": dead_s,
    }


def start_redis(children: Children) -> tuple[str, int]:
    port = free_port()
    cmd = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    cmd += ["--dir", str(children.temporary_directory()), "--loglevel", "warning", "--maxclients", "10000"]
    child = children.start(Child("redis", cmd))
    child.wait_listening(port, 20)
    return f"redis://127.0.0.1:{port}/0", child.pid


def fit_memory(results: list[dict[str, Any]]) -> tuple[float, float]:
    """Bytes per replica (the slope over the sizes) and per deployment (what is left at 0 replicas, over 100)."""
    xs = [r["replicas"] for r in results]
    ys = [r["memory_bytes"] for r in results]
    if len(xs) < 2:
        return ys[0] / xs[0], 0.0
    slope = statistics.linear_regression(xs, ys).slope
    intercept = statistics.linear_regression(xs, ys).intercept
    return slope, max(0.0, intercept / DEPLOYMENTS)


def run(opts: Options) -> Section:
    sizes = QUICK_SIZES if opts.quick else SIZES
    if only := os.environ.get("SCALE_SIM_SIZES"):  # e.g. "1000": re-measure one size
        sizes = tuple(int(size) for size in only.split(","))
    results = []
    with Children() as children:
        url, redis_pid = start_redis(children)
        for size in sizes:
            print(f"scale_sim: {DEPLOYMENTS} deployments x {size} replicas", flush=True)
            results.append(measure_size(url, redis_pid, size, opts, children))
            print(f"scale_sim: {orjson.dumps(results[-1]).decode()}", flush=True)
    return report(results, opts)


def report(results: list[dict[str, Any]], opts: Options) -> Section:
    section = Section(
        key="scale_sim", title="The scheduler at scale: 100 deployments, simulated replicas (bench/scale_sim.py)"
    )
    section.setup = [
        "`python -m bench.scale_sim`: one real scheduler (its own process, a launcher that starts nothing) and one "
        f"redis-server; one writer process beats every replica each {BEAT_INTERVAL_S:g} s (the heartbeat interval), "
        "in one pipeline.",
        f"Per size, once every replica is RUNNING: a {QUICK_WINDOW_S if opts.quick else WINDOW_S:g} s window for "
        "ticks, commands, bytes and CPU; then config pushes to 1,000 long-poll subscribers (4 processes); then 1,000 "
        f"replicas, each holding a request, go silent (heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s).",
        "Commands per tick: Redis INFO commandstats less the writer's own (it counts them) and the bench's; bytes "
        "per tick: what the scheduler's sockets sent and received (`ss -tinp`). CPU: fraction of one core.",
    ]
    header = ["replicas", "ramp to RUNNING", "tick p50", "tick p99", "commands/tick", "KiB/tick", "scheduler CPU"]
    header += ["Redis CPU", "beats writer CPU", "push p50", "push p99", "1,000 dead: re-queued after"]
    rows = [
        [
            f"{r['replicas']:,}",
            f"{r['ramp_s']:.0f} s",
            f"{r['tick_p50_ms']:.1f} ms",
            f"{r['tick_p99_ms']:.1f} ms",
            f"{r['commands_per_tick']:.0f}",
            f"{r['bytes_per_tick'] / 1024:,.0f}",
            f"{r['cpu']['scheduler']:.2f}",
            f"{r['cpu']['redis']:.2f}",
            f"{r['cpu']['beats']:.2f}",
            f"{r['push_p50_ms']:.1f} ms",
            f"{r['push_p99_ms']:.1f} ms",
            f"{r['dead_s']:.1f} s",
        ]
        for r in results
    ]
    section.body = md_table(header, rows)
    per_replica, per_deployment = fit_memory(results)
    section.body += [
        "",
        f"Redis memory: {per_replica:,.0f} bytes per replica (record, heartbeat and its time, consumer), "
        f"{per_deployment:,.0f} bytes per deployment beyond its replicas (fitted over the sizes, INFO used_memory).",
        "",
        "Commands per tick, the most frequent: "
        + "; ".join(
            f"{r['replicas']:,}: " + ", ".join(f"{k} {v:.0f}" for k, v in r["top_commands"].items()) for r in results
        ),
    ]
    by_size = {r["replicas"]: r for r in results}
    checks = [
        ("tick p99 at 10,000 replicas", 10_000, "tick_p99_ms"),
        ("tick p99 at 100,000 replicas", 100_000, "tick_p99_ms"),
    ]
    for label, replicas, field in checks:
        got = by_size.get(replicas)
        ok = None if got is None else got[field] < TARGETS[label]
        shown = "not run" if got is None else f"{got[field]:.0f} ms"
        section.verdicts.append(f"{label} < {TARGETS[label]:g} ms: {shown}, {verdict(ok)}.")
    worst_push = max(r["push_p99_ms"] for r in results)
    section.verdicts.append(
        f"config push p99 < 100 ms to 1,000 subscribers: worst {worst_push:.0f} ms, {verdict(worst_push < 100)}."
    )
    worst_cpu = max(r["cpu"]["scheduler"] for r in results)
    section.verdicts.append(f"scheduler below one core: at most {worst_cpu:.2f}, {verdict(worst_cpu < 1.0)}.")
    section.data = {"results": results, "memory_per_replica": per_replica, "memory_per_deployment": per_deployment}
    return section


ROLES = {"scheduler": run_scheduler, "beats": run_beats}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("scheduler", "beats"):
        asyncio.run(ROLES[argv[0]](argv[1]))
        return 0
    if argv and argv[0] == "listen":
        asyncio.run(run_listener(argv[1], int(argv[2]), int(argv[3])))
        return 0
    return standalone(run, "the scheduler at scale: 100 deployments of simulated replicas", argv)


if __name__ == "__main__":
    raise SystemExit(main())
