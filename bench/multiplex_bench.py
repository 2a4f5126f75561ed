"""What model-aware routing buys (issue 31): loads per 1,000 requests, p50 and p99 of a multiplexing deployment under a
skewed (Zipf) load, with our routing and with random routing, for a working set that fits the replicas and one that
does not.

    .venv/bin/python -m bench.multiplex_bench [--quick] [--reps 3] [--out FILE]

One farm: `mux` (bench/deployments.py MuxModels), 2 replicas x 4 models each, max_ongoing_requests 8; each model load
takes LOAD_S, each request WORK_S. The Python client in this process sends REQUESTS calls, CONCURRENCY at a time, each
naming a model drawn from a Zipf law (s = ZIPF_S) over 8 or 32 models. Random routing is the same client with the
route left out of its enqueue (every request on the deployment's stream, taken by whichever replica reads first): what
a deployment gets without model-aware routing. Every run names fresh models, so each starts cold; the kinds of run take
turns within each repetition.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import uvloop

from bench.children import Children
from bench.farm import start_farm
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.standalone import standalone
from bench.stats import Sample, Spread, ratio
from streamserve.client import AsyncClient, calls

LOADS_KEY = "bench:mux:loads"
LOAD_S = 0.1
WORK_S = 0.002
REPLICAS, SLOTS = 2, 4
CONCURRENCY = 16
ZIPF_S = 1.1
REQUESTS = (2000, 400)  # full, quick
# The goal: at least 10x fewer loads than random routing while the working set fits.
GOAL = 10.0


CONFIG = f"""\
deployments:
  - name: mux
    import_path: bench.deployments:MuxModels
    init_kwargs: {{report_key: "{LOADS_KEY}", load_s: {LOAD_S}, work_s: {WORK_S}}}
    num_replicas: {REPLICAS}
    max_ongoing_requests: 8
    max_queued_requests: 10000
"""


@dataclass(frozen=True)
class Kind:
    models: int
    routed: bool

    @property
    def name(self) -> str:
        return f"{self.models} models, {'model-aware' if self.routed else 'random'} routing"


KINDS = tuple(Kind(models, routed) for models in (8, 32) for routed in (True, False))


def zipf_picks(models: int, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** ZIPF_S for rank in range(models)]
    return rng.choices(range(models), weights, k=count)


@contextlib.contextmanager
def random_routing(on: bool) -> Iterator[None]:
    """The client's enqueue without its route (calls.route_spec): every request on the deployment's stream."""
    kept = calls.route_spec
    if on:
        calls.route_spec = lambda *_: ""
    try:
        yield
    finally:
        calls.route_spec = kept


async def measure(redis_url: str, kind: Kind, count: int, seed: int) -> Sample:
    run = uuid.uuid4().hex[:8]
    picks = zipf_picks(kind.models, count, seed)
    sample = Sample()
    async with AsyncClient(redis_url) as client:
        queue = iter(picks)

        async def caller() -> None:
            for pick in queue:
                t0 = time.perf_counter()
                try:
                    await client.call("mux", {}, model_id=f"{run}-{pick}", timeout=60)
                    sample.latencies.append(time.perf_counter() - t0)
                    sample.ok += 1
                except Exception as exc:
                    sample.error(exc)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
        sample.seconds = time.perf_counter() - started
    return sample


def run(opts: Options) -> Section:
    count = REQUESTS[1] if opts.quick else REQUESTS[0]
    samples: dict[str, list[Sample]] = {kind.name: [] for kind in KINDS}
    loads: dict[str, list[float]] = {kind.name: [] for kind in KINDS}
    with Children() as children:
        farm = start_farm(children, CONFIG)
        store = redis.Redis.from_url(farm.effective_redis_url)
        try:
            for rep in range(opts.reps):
                for i, kind in enumerate(KINDS):
                    before = int(store.get(LOADS_KEY) or 0)
                    with random_routing(not kind.routed):
                        sample = uvloop.run(measure(farm.effective_redis_url, kind, count, seed=rep * 10 + i))
                    loaded = int(store.get(LOADS_KEY) or 0) - before
                    per_1000 = 1000 * loaded / max(1, sample.ok)
                    print(
                        f"  {kind.name:<38} rep {rep + 1}: loads/1000 {per_1000:7.1f} p50 {sample.p(0.5):7.2f} ms "
                        f"p99 {sample.p(0.99):7.2f} ms {sample.rps:7.0f} req/s errors {sample.errors}",
                        flush=True,
                    )
                    samples[kind.name].append(sample)
                    loads[kind.name].append(per_1000)
        finally:
            store.close()
    section = Section("multiplexing", "Multiplexing: loads per 1,000 requests with model-aware and random routing")
    section.setup = [
        f"One `streamserve up` farm (embedded Redis): `mux`, {REPLICAS} replicas x {SLOTS} models "
        f"(`@streamserve.multiplexed(max_models_per_replica={SLOTS})`), max_ongoing_requests 8; a load takes "
        f"{LOAD_S * 1000:.0f} ms, a request {WORK_S * 1000:.0f} ms.",
        f"{count} calls a run from the Python client, {CONCURRENCY} at a time, each naming a model drawn from a "
        f"Zipf law (s = {ZIPF_S}) over 8 or 32 models; every run names fresh models (a cold start, counted).",
        "Random routing: the same client with the route left out of the enqueue, so any replica takes any request. "
        "The kinds of run take turns within each repetition.",
    ]
    rows = []
    for kind in KINDS:
        found = samples[kind.name]
        rows.append(
            [
                kind.name,
                Spread.of(loads[kind.name]).fmt(1),
                Spread.of([s.p(0.5) for s in found]).fmt(2),
                Spread.of([s.p(0.99) for s in found]).fmt(2),
                Spread.of([s.rps for s in found]).fmt(0),
            ]
        )
    section.body = md_table(["run", "loads / 1,000 requests", "p50 ms", "p99 ms", "req/s"], rows)
    for models in (8, 32):
        routed = Spread.of(loads[Kind(models, True).name]).median
        spread = Spread.of(loads[Kind(models, False).name]).median
        r = ratio(spread, routed)
        fits = models <= REPLICAS * SLOTS
        goal = f" (goal >= {GOAL:g}x while the working set fits: {verdict(r >= GOAL)})" if fits else ""
        section.verdicts.append(
            f"{models} models ({'fits' if fits else 'does not fit'} in {REPLICAS} x {SLOTS}): random routing loads "
            f"**{r:.1f}x** as often as model-aware routing{goal}."
        )
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
