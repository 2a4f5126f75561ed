"""What shared runs cost and save (issue 29): a response-cache hit beside a noop miss over HTTP, and a unary call
with an idempotency key beside one without, over HTTP and on the client path, taking turns within each repetition on
one farm.

    .venv/bin/python -m bench.shared_runs_bench [--quick] [--reps 3] [--duration 10] [--out FILE]
"""

from __future__ import annotations

import uvloop

from bench.children import Children
from bench.client_bench import OUTSTANDING
from bench.driver import run_driver
from bench.farm import start_farm
from bench.http_bench import BODY, CONCURRENCIES
from bench.loadgen import http_measure, keyed_requests
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.servers import NOOP_CONFIG
from bench.standalone import standalone
from bench.stats import Summary, ratio

# The HTTP bench's noop deployment, and its twin with a response cache (every request of a phase is identical:
# after the first, all are hits).
CONFIG = (
    NOOP_CONFIG
    + """\
  - name: noop-cached
    import_path: examples.functions:noop
    num_replicas: 1
    max_ongoing_requests: 32
    max_queued_requests: 5000
    response_cache: {ttl_s: 600, max_entries: 1000}
"""
)
HTTP_TARGETS = {"miss": "/noop", "hit": "/noop-cached", "with an idempotency key": "/noop"}
# The HTTP target whose every request carries an Idempotency-Key of its own (so every one runs).
HTTP_KEYED = "with an idempotency key"
CLIENT_TARGETS = {"without a key": "streamserve", "with an idempotency key": "streamserve-keyed"}
CLIENT_CONCURRENCIES = (OUTSTANDING, 1)
# The goals: a hit at least 1.5x a miss's throughput (and its p50 below a miss's); a key costs a unary call
# at most 10% of its throughput.
HIT_GOAL = 1.5
KEY_BUDGET = 0.10


def run(opts: Options) -> Section:
    http: dict[str, dict[int, list[dict[str, float]]]] = {t: {c: [] for c in CONCURRENCIES} for t in HTTP_TARGETS}
    client: dict[str, dict[int, list[dict[str, float]]]] = {
        t: {c: [] for c in CLIENT_CONCURRENCIES} for t in CLIENT_TARGETS
    }
    with Children() as children:
        farm = start_farm(children, CONFIG)
        for rep in range(opts.reps):
            for name, path in HTTP_TARGETS.items():
                for concurrency in CONCURRENCIES:
                    requests = keyed_requests(farm.port, path, BODY) if name == HTTP_KEYED else None
                    sample = uvloop.run(
                        http_measure(
                            farm.port,
                            path,
                            BODY,
                            concurrency,
                            opts.warmup_s,
                            opts.duration_s,
                            opts.max_requests,
                            requests,
                        )
                    )
                    print(
                        f"  http {name:<23} rep {rep + 1} c={concurrency:<3} {sample.rps:>8.0f} req/s "
                        f"p50 {sample.p(0.5):.3f} ms errors {sample.errors}",
                        flush=True,
                    )
                    http[name][concurrency].append(sample.to_json())
            for name, target in CLIENT_TARGETS.items():
                for concurrency in CLIENT_CONCURRENCIES:
                    result = run_driver(target, farm.effective_redis_url, concurrency, opts)
                    print(
                        f"  client {name:<24} rep {rep + 1} c={concurrency:<3} {result['rps']:>8.0f}/s "
                        f"p50 {result['p50_ms']:.3f} ms errors {result['errors']}",
                        flush=True,
                    )
                    client[name][concurrency].append(result)
    http_found = {name: {c: Summary.of(s) for c, s in by_c.items()} for name, by_c in http.items()}
    client_found = {name: {c: Summary.of(s) for c, s in by_c.items()} for name, by_c in client.items()}
    section = Section("shared_runs", "Shared runs: a response-cache hit, and what an idempotency key costs")
    section.setup = [
        "One `streamserve up` farm (embedded Redis, 1 gateway process): `noop` (the HTTP bench's deployment) and "
        "`noop-cached`, the same with `response_cache`. Every request of a phase has the same body, so every "
        "request to `noop-cached` after its first is a hit: the second answered by the enqueue script from Redis, the "
        "ones after from the gateway's own copy of that entry (`local_ttl_s`, 1 s by default, read again from "
        "Redis each time it lapses), without a replica.",
        "`Idempotency-Key` over HTTP: `POST /noop` with a key of its own on every request (every one runs), beside "
        "the miss row's same requests without one.",
        f"Client path: `AsyncClient.call` of `noop` with {OUTSTANDING} calls outstanding and one at a time, without "
        "a key and with a fresh idempotency key per call (so every call runs: the key's record is made, the reply "
        "stored in it). Each phase in a fresh process (`bench.driver`).",
        "The targets take turns within each repetition.",
    ]
    rows = [
        [f"HTTP {name} (`{HTTP_TARGETS[name]}`)", by_c[32].rps.fmt(0), by_c[32].p50_ms.fmt(3), by_c[1].p50_ms.fmt(3)]
        for name, by_c in http_found.items()
    ]
    rows += [
        [f"client {name}", by_c[OUTSTANDING].rps.fmt(0), by_c[OUTSTANDING].p50_ms.fmt(3), by_c[1].p50_ms.fmt(3)]
        for name, by_c in client_found.items()
    ]
    section.body = md_table(["target", "req/s (c=32 HTTP, 256 client)", "p50 ms at that", "p50 ms c=1"], rows)
    hit, miss = http_found["hit"], http_found["miss"]
    r = ratio(hit[32].rps.median, miss[32].rps.median)
    section.verdicts.append(
        f"Cache hit / miss, req/s at c=32: **{r:.2f}x** (goal >= {HIT_GOAL}x: {verdict(r >= HIT_GOAL)})."
    )
    below = hit[1].p50_ms.median < miss[1].p50_ms.median
    section.verdicts.append(
        f"p50 at c=1, hit {hit[1].p50_ms.median:.3f} ms vs miss {miss[1].p50_ms.median:.3f} ms "
        f"(goal: below: {verdict(below)})."
    )
    r = ratio(http_found[HTTP_KEYED][32].rps.median, miss[32].rps.median)
    section.verdicts.append(
        f"HTTP req/s at c=32 with a key / without: **{r:.3f}** (budget >= {1 - KEY_BUDGET:.2f}: "
        f"{verdict(r >= 1 - KEY_BUDGET)})."
    )
    keyed, plain = client_found["with an idempotency key"], client_found["without a key"]
    r = ratio(keyed[OUTSTANDING].rps.median, plain[OUTSTANDING].rps.median)
    met = verdict(r >= 1 - KEY_BUDGET)
    section.verdicts.append(
        f"Client calls/s with a key / without: **{r:.3f}** (budget >= {1 - KEY_BUDGET:.2f}: {met})."
    )
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
