"""What priorities and tenant limits buy (issue 30): one-at-a-time probe requests to a saturated deployment with a
backlog of low requests, and to one that another tenant floods, beside the same probes to the idle deployment, taking
turns within each repetition on one farm.

    .venv/bin/python -m bench.priority_bench [--quick] [--reps 3] [--out FILE]

Both deployments sleep 5 ms per request, 4 at a time (800 req/s at most). A feeder (an AsyncClient in this process)
keeps at least BACKLOG requests queued at one level while the probes run; a flooder (the same) sends one tenant's
requests as fast as the limits let it, 8 at a time, without waiting for their answers. Each probe is one POST through
the gateway, on a kept connection, timed from send to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import httpx
import redis.asyncio as aioredis
import uvloop

from bench.children import Children
from bench.farm import start_farm
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.standalone import standalone
from bench.stats import Sample, Spread, ratio
from streamserve.client import AsyncClient
from streamserve.wire.errors import RateLimitedError
from streamserve.wire.keys import Keys
from streamserve.wire.priorities import Priority

CONFIG = """\
deployments:
  - name: paced
    import_path: examples.sleepy:Sleepy
    init_kwargs: {seconds: 0.005}
    num_replicas: 1
    max_ongoing_requests: 4
    max_queued_requests: 5000
    route_prefix: /paced
  - name: shared
    import_path: examples.sleepy:Sleepy
    init_kwargs: {seconds: 0.005}
    num_replicas: 1
    max_ongoing_requests: 4
    max_queued_requests: 5000
    route_prefix: /shared
    tenant_limits:
      default: {requests_per_s: 400, burst: 40, max_queued: 4}
"""
BACKLOG = 1000
# The goals: a high request's p99 under a full low backlog within 3x of the idle deployment's p99; a tenant's
# p50 while another floods within 2x of its p50 without the flood.
GOAL = 3.0
NEIGHBOUR_GOAL = 2.0
FLOODERS = 8
# How long a backlog may take to drain (or build) before the bench gives up.
SETTLE_S = 60.0


# (name, the level the backlog is queued at or None for none, the probes' X-Priority or None, probes per rep
# (full, quick)): FIFO probes wait behind the whole backlog (over a second each), so they are few.
@dataclass(frozen=True)
class Phase:
    name: str
    path: str
    backlog: Priority | None  # the level a backlog is kept at, or none
    headers: dict[str, str]  # the probes'
    probes: tuple[int, int]  # per repetition, full and quick: FIFO probes wait behind the whole backlog, so few
    flood: bool = False  # another tenant floods the deployment meanwhile


PHASES = (
    Phase("idle", "/paced", None, {}, (200, 40)),
    Phase("high under a low backlog", "/paced", Priority.LOW, {"X-Priority": "high"}, (200, 40)),
    Phase("no priority under a low backlog", "/paced", Priority.LOW, {}, (200, 40)),
    Phase("no priority under a backlog of the same level (FIFO)", "/paced", Priority.NORMAL, {}, (8, 3)),
    Phase("tenant alone (tenant_limits)", "/shared", None, {"X-Tenant": "quiet"}, (200, 40)),
    Phase("tenant while another floods", "/shared", None, {"X-Tenant": "quiet"}, (200, 40), flood=True),
)


async def queued(redis: aioredis.Redis, stream: str) -> int:
    """Entries of ``stream`` (queued and held): what the feeder keeps above BACKLOG."""
    return int(await redis.xlen(stream))


async def feed(client: AsyncClient, redis: aioredis.Redis, level: Priority, stop: asyncio.Event) -> None:
    """Keep at least BACKLOG requests queued at ``level`` until ``stop``."""
    stream = Keys().requests("paced", level)
    while not stop.is_set():
        missing = BACKLOG + 100 - await queued(redis, stream)
        if missing > 0:
            await asyncio.gather(*(client.send("paced", {}, priority=level.value) for _ in range(missing)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


async def flood(client: AsyncClient, stop: asyncio.Event, admitted: list[int]) -> None:
    """Send the tenant ``flood``'s requests to ``shared`` until ``stop``, as fast as its limits admit them."""
    while not stop.is_set():
        try:
            await client.send("shared", {}, tenant="flood")
            admitted[0] += 1
        except RateLimitedError:
            await asyncio.sleep(0.001)  # refused at once: a real flood would retry as fast (this keeps our CPU)


async def drained(redis: aioredis.Redis, deployment: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    streams = Keys().request_streams(deployment).values()
    while sum([await queued(redis, s) for s in streams]) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the backlog did not drain")
        await asyncio.sleep(0.05)


async def measure(port: int, redis_url: str, phase: Phase, probes: int) -> tuple[Sample, int]:
    """The probes' latencies, and how many flood requests were admitted meanwhile."""
    sample = Sample()
    stop = asyncio.Event()
    admitted = [0]
    deployment = phase.path.strip("/")
    async with AsyncClient(redis_url) as client, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        redis = aioredis.Redis.from_url(redis_url)
        helpers: list[asyncio.Task[None]] = []
        try:
            if phase.backlog is not None:
                helpers.append(asyncio.create_task(feed(client, redis, phase.backlog, stop)))
                stream = Keys().requests(deployment, phase.backlog)
                deadline = time.monotonic() + SETTLE_S
                while await queued(redis, stream) < BACKLOG:
                    if time.monotonic() > deadline or helpers[0].done():
                        raise RuntimeError("the backlog did not build")
                    await asyncio.sleep(0.02)
            if phase.flood:
                helpers += [asyncio.create_task(flood(client, stop, admitted)) for _ in range(FLOODERS)]
                await asyncio.sleep(0.5)  # the flood under way
            started = time.perf_counter()
            for _ in range(probes):
                t0 = time.perf_counter()
                try:
                    answer = await http.post(phase.path, json={}, headers=phase.headers, timeout=SETTLE_S)
                    answer.raise_for_status()
                    sample.latencies.append(time.perf_counter() - t0)
                    sample.ok += 1
                except httpx.HTTPError as exc:
                    sample.error(exc)
            sample.seconds = time.perf_counter() - started
        finally:
            stop.set()
            await asyncio.gather(*helpers)
            await drained(redis, deployment)
            await redis.aclose()
    return sample, admitted[0]


def run(opts: Options) -> Section:
    found: dict[str, list[Sample]] = {phase.name: [] for phase in PHASES}
    flooded: list[float] = []
    with Children() as children:
        farm = start_farm(children, CONFIG)
        for rep in range(opts.reps):
            for phase in PHASES:
                probes = phase.probes[1] if opts.quick else phase.probes[0]
                sample, admitted = uvloop.run(measure(farm.port, farm.effective_redis_url, phase, probes))
                print(
                    f"  {phase.name:<52} rep {rep + 1}: p50 {sample.p(0.5):8.2f} ms p99 {sample.p(0.99):8.2f} ms "
                    f"errors {sample.errors}" + (f" flood admitted {admitted}" if phase.flood else ""),
                    flush=True,
                )
                found[phase.name].append(sample)
                if phase.flood:
                    flooded.append(admitted / sample.seconds if sample.seconds else 0.0)
    p50 = {name: Spread.of([s.p(0.5) for s in samples]) for name, samples in found.items()}
    p99 = {name: Spread.of([s.p(0.99) for s in samples]) for name, samples in found.items()}
    section = Section(
        "priorities", "Priorities and tenant limits: a high request under a low backlog, a tenant beside a flood"
    )
    section.setup = [
        "One `streamserve up` farm (embedded Redis, 1 gateway process): `paced` and `shared` "
        "(`examples.sleepy:Sleepy`, 5 ms per request, max_ongoing_requests 4, 1 replica: 800 req/s at most each); "
        "`shared` has `tenant_limits: {default: {requests_per_s: 400, burst: 40, max_queued: 4}}`.",
        f"Backlog phases: a feeder keeps at least {BACKLOG} requests queued at one level of `paced` (its replica "
        "saturated) while probes go one at a time through the gateway, each timed from send to answer.",
        f"Flood phase: {FLOODERS} senders in this process (the Python client, straight to Redis) send the tenant "
        "`flood`'s requests to `shared` as fast as its limits admit them, while the tenant `quiet` probes.",
        "The phases take turns within each repetition.",
    ]
    rows = [
        [
            phase.name,
            str(sum(len(s.latencies) for s in found[phase.name])),
            p50[phase.name].fmt(2),
            p99[phase.name].fmt(2),
        ]
        for phase in PHASES
    ]
    section.body = md_table(["probes", "answered", "p50 ms", "p99 ms"], rows)
    idle, high = p99["idle"].median, p99["high under a low backlog"].median
    r = ratio(high, idle)
    section.verdicts.append(
        f"High p99 under a full low backlog / idle p99: **{r:.2f}x** (goal <= {GOAL}x: {verdict(r <= GOAL)})."
    )
    fifo = p50["no priority under a backlog of the same level (FIFO)"].median
    section.verdicts.append(
        f"Without priorities a probe waits behind the backlog: p50 {fifo:.0f} ms, "
        f"{ratio(fifo, p50['high under a low backlog'].median):.0f}x a high probe's."
    )
    alone, beside = p50["tenant alone (tenant_limits)"].median, p50["tenant while another floods"].median
    r = ratio(beside, alone)
    rate = Spread.of(flooded)
    section.verdicts.append(
        f"A tenant's p50 while another floods / alone: **{r:.2f}x** (goal <= {NEIGHBOUR_GOAL}x: "
        f"{verdict(r <= NEIGHBOUR_GOAL)}); the flood was admitted at {rate.fmt(0)} req/s."
    )
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
