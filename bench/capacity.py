"""The capacity plan's per-request figures: Redis commands and the CPU each process spends on one request, on the
HTTP path, the client path and the client path with batching, and what follows per Redis core and per gateway.

    .venv/bin/python -m bench.capacity [--quick] [--reps N] [--out FILE]

Each path runs ``bench.cpu_probe`` (its own embedded Redis, one replica, a gateway for HTTP) ``--reps`` times;
the figures are the medians. A process's requests/s per core is 1,000,000 us over its CPU us per request: what
one core of it carries when nothing else limits.
"""

from __future__ import annotations

import statistics

import uvloop

from bench.cpu_probe import Measured, probe
from bench.options import Options
from bench.section import Section, md_table
from bench.standalone import standalone

REQUESTS = 20_000
QUICK_REQUESTS = 3_000
PATHS = {
    "client": "Python client, `noop` function",
    "batch": "Python client, batched `scale` (up to 16 per call)",
    "http": "HTTP `POST /echo`, 32 connections",
}


def median_of(runs: list[Measured]) -> Measured:
    """The median of every figure over the runs (each figure on its own)."""
    names = {n for r in runs for n in r.cpu_us}
    commands = {c for r in runs for c in r.commands}
    return Measured(
        req_s=statistics.median(r.req_s for r in runs),
        cpu_us={n: statistics.median(r.cpu_us.get(n, 0.0) for r in runs) for n in sorted(names)},
        commands={c: statistics.median(r.commands.get(c, 0.0) for r in runs) for c in sorted(commands)},
    )


def per_core(us: float) -> str:
    return f"{1e6 / us:,.0f}" if us > 0 else "-"


def run(opts: Options) -> Section:
    n = QUICK_REQUESTS if opts.quick else REQUESTS
    reps = max(1, opts.reps)
    measured: dict[str, Measured] = {}
    for path in PATHS:
        runs = [uvloop.run(probe(n, path))[0] for _ in range(reps)]
        measured[path] = median_of(runs)
    section = Section(key="capacity", title="Capacity: Redis commands and CPU per request (bench/capacity.py)")
    section.setup = [
        f"`python -m bench.capacity`: each path {reps} time(s), {n:,} measured requests after 2,000 warm-up; medians.",
        "CPU from /proc per process (the load generator's from getrusage); commands from Redis INFO commandstats.",
        "Per core = 1,000,000 us / CPU us per request: what one core of that process carries when nothing else limits.",
    ]
    header = ["path", "req/s (this box)", "Redis commands/req", "Redis us/req", "gateway us/req", "replica us/req"]
    header += ["req/s per Redis core", "req/s per gateway process"]
    rows = []
    for path, m in measured.items():
        gateway = m.cpu_us.get("gateway", 0.0)
        row = [PATHS[path], f"{m.req_s:,.0f}", f"{sum(m.commands.values()):.2f}", f"{m.cpu_us['redis']:.1f}"]
        row += [f"{gateway:.1f}" if gateway else "-", f"{m.cpu_us['replica']:.1f}"]
        row += [per_core(m.cpu_us["redis"]), per_core(gateway)]
        rows.append(row)
    section.body = md_table(header, rows)
    # Commands under one in 2,000 requests (the replica's heartbeat, the metrics flush) are left out.
    by_command = sorted({c for m in measured.values() for c, per in m.commands.items() if per >= 0.0005})
    section.body += ["", "Redis commands per request, by command:", ""]
    section.body += md_table(
        ["command", *PATHS], [[c, *[f"{m.commands.get(c, 0.0):.3f}" for m in measured.values()]] for c in by_command]
    )
    section.data = {
        path: {"req_s": m.req_s, "cpu_us": m.cpu_us, "commands": m.commands} for path, m in measured.items()
    }
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "capacity: Redis commands and CPU per request on each path", argv)


if __name__ == "__main__":
    raise SystemExit(main())
