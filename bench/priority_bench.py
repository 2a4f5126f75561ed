"""What a priority buys (issue 30): one-at-a-time probe requests to a saturated deployment with a backlog of low
requests, beside the same probes to the idle deployment, taking turns within each repetition on one farm.

    .venv/bin/python -m bench.priority_bench [--quick] [--reps 3] [--out FILE]

The deployment sleeps 5 ms per request, 4 at a time (800 req/s at most). A feeder (an AsyncClient in this process)
keeps at least BACKLOG requests queued at one level while the probes run; each probe is one POST through the gateway,
on a kept connection, timed from send to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

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
"""
BACKLOG = 1000
# The goal: a high request's p99 under a full low backlog within 3x of the idle deployment's p99.
GOAL = 3.0
# How long a backlog may take to drain (or build) before the bench gives up.
SETTLE_S = 60.0
# (name, the level the backlog is queued at or None for none, the probes' X-Priority or None, probes per rep
# (full, quick)): FIFO probes wait behind the whole backlog (over a second each), so they are few.
PHASES = (
    ("idle", None, None, (200, 40)),
    ("high under a low backlog", Priority.LOW, "high", (200, 40)),
    ("no priority under a low backlog", Priority.LOW, None, (200, 40)),
    ("no priority under a backlog of the same level (FIFO)", Priority.NORMAL, None, (8, 3)),
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


async def drained(redis: aioredis.Redis) -> None:
    deadline = time.monotonic() + SETTLE_S
    streams = Keys().request_streams("paced").values()
    while sum([await queued(redis, s) for s in streams]) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the backlog did not drain")
        await asyncio.sleep(0.05)


async def phase(port: int, redis_url: str, backlog: Priority | None, header: str | None, probes: int) -> Sample:
    sample = Sample()
    stop = asyncio.Event()
    async with AsyncClient(redis_url) as client, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        redis = aioredis.Redis.from_url(redis_url)
        feeder = None
        try:
            if backlog is not None:
                feeder = asyncio.create_task(feed(client, redis, backlog, stop))
                stream = Keys().requests("paced", backlog)
                deadline = time.monotonic() + SETTLE_S
                while await queued(redis, stream) < BACKLOG:
                    if time.monotonic() > deadline or feeder.done():
                        raise RuntimeError("the backlog did not build")
                    await asyncio.sleep(0.02)
            headers = {"X-Priority": header} if header else {}
            started = time.perf_counter()
            for _ in range(probes):
                t0 = time.perf_counter()
                try:
                    answer = await http.post("/paced", json={}, headers=headers, timeout=SETTLE_S)
                    answer.raise_for_status()
                    sample.latencies.append(time.perf_counter() - t0)
                    sample.ok += 1
                except httpx.HTTPError as exc:
                    sample.error(exc)
            sample.seconds = time.perf_counter() - started
        finally:
            stop.set()
            if feeder is not None:
                await feeder
            await drained(redis)
            await redis.aclose()
    return sample


def run(opts: Options) -> Section:
    found: dict[str, list[Sample]] = {name: [] for name, *_ in PHASES}
    with Children() as children:
        farm = start_farm(children, CONFIG)
        for rep in range(opts.reps):
            for name, backlog, header, counts in PHASES:
                probes = counts[1] if opts.quick else counts[0]
                sample = uvloop.run(phase(farm.port, farm.effective_redis_url, backlog, header, probes))
                print(
                    f"  {name:<52} rep {rep + 1}: p50 {sample.p(0.5):8.2f} ms p99 {sample.p(0.99):8.2f} ms "
                    f"errors {sample.errors}",
                    flush=True,
                )
                found[name].append(sample)
    p50 = {name: Spread.of([s.p(0.5) for s in samples]) for name, samples in found.items()}
    p99 = {name: Spread.of([s.p(0.99) for s in samples]) for name, samples in found.items()}
    section = Section("priorities", "Priorities: a high request under a full low backlog")
    section.setup = [
        "One `streamserve up` farm (embedded Redis, 1 gateway process): `paced` (`examples.sleepy:Sleepy`, 5 ms per "
        "request, max_ongoing_requests 4, 1 replica: 800 req/s at most).",
        f"Backlog phases: a feeder keeps at least {BACKLOG} requests queued at one level (the replica saturated) "
        "while probes go one at a time through the gateway, each timed from send to answer.",
        "The phases take turns within each repetition.",
    ]
    rows = [
        [name, str(sum(len(s.latencies) for s in found[name])), p50[name].fmt(2), p99[name].fmt(2)]
        for name, *_ in PHASES
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
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
