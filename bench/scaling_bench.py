"""Scaling: an I/O-bound deployment (10 ms sleep, max_ongoing_requests 1) at 1, 2, 4 and 8 replicas.

One replica can answer at most 100 requests/s; N replicas at most N x 100. The bench keeps the
queue full (64 calls outstanding from the Python client) and reports throughput and its efficiency
against N x 100 req/s.

    .venv/bin/python -m bench.scaling_bench [--quick] [--out FILE]
"""

from __future__ import annotations

import orjson

from bench.children import Children
from bench.driver import run_driver
from bench.farm import start_farm, wait_running
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.standalone import standalone
from bench.stats import Spread, Summary
from tests.harness.farm import Farm

REPLICAS = (1, 2, 4, 8)
OUTSTANDING = 64
SLEEP_S = 0.01
NAME = "sleep10"
CONFIG = f"""\
deployments:
  - name: {NAME}
    import_path: examples.sleepy:Sleepy
    init_kwargs: {{seconds: {SLEEP_S}}}
    num_replicas: 1
    max_ongoing_requests: 1
    max_queued_requests: 5000
    route_prefix: null
"""


def scale(farm: Farm, replicas: int) -> None:
    farm.cli("scale", NAME, str(replicas), "--wait", "--timeout", "180", timeout_s=200)
    wait_running(farm)


def run(opts: Options) -> Section:
    section = Section("scaling", "Scaling: I/O-bound deployment, 1 to 8 replicas")
    body = orjson.dumps({"seconds": SLEEP_S}).decode()
    results: dict[int, Summary] = {}
    with Children() as children:
        farm = start_farm(children, CONFIG)
        for replicas in REPLICAS:
            scale(farm, replicas)
            samples = []
            for rep in range(opts.reps):
                sample = run_driver(
                    "streamserve", farm.effective_redis_url, OUTSTANDING, opts, "--deployment", NAME, "--body", body
                )
                print(
                    f"  scaling N={replicas} rep {rep + 1}: {sample['rps']:>7.0f} req/s "
                    f"({sample['rps'] / (100 * replicas):.0%}) errors {sample['errors']} {sample['first_error']}",
                    flush=True,
                )
                samples.append(sample)
            results[replicas] = Summary.of(samples)
    section.setup = [
        f"Deployment `{NAME}` = `examples.sleepy:Sleepy` (`await asyncio.sleep({SLEEP_S})`), max_ongoing_requests 1, "
        f"scaled with `streamserve scale --wait` on one `streamserve up`.",
        f"Load: streamserve AsyncClient, {OUTSTANDING} calls outstanding (closed loop), in a fresh process per "
        "repetition.",
        "Efficiency = req/s / (N x 100 req/s); one replica cannot beat 100 req/s, and each request also pays the "
        "queue round trip on top of its 10 ms.",
    ]
    rows = []
    for replicas, summary in results.items():
        eff = Spread.of([100 * x / (100 * replicas) for x in (summary.rps.median, summary.rps.lo, summary.rps.hi)])
        rows.append(
            [
                str(replicas),
                f"{100 * replicas}",
                summary.rps.fmt(0),
                f"{eff.median:.0f}% ({eff.lo:.0f}-{eff.hi:.0f}%)",
                summary.p50_ms.fmt(1),
                str(summary.errors),
            ]
        )
    section.body = md_table(["replicas", "ideal req/s", "req/s", "efficiency", "p50 ms", "errors"], rows)
    top = results.get(max(REPLICAS))
    if top is not None:
        eff8 = top.rps.median / (100 * max(REPLICAS))
        section.verdicts.append(
            f"Efficiency at {max(REPLICAS)} replicas: **{eff8:.0%}** (target >= 90%: {verdict(eff8 >= 0.9)})."
        )
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "scaling: I/O-bound deployment at 1, 2, 4, 8 replicas", argv)


if __name__ == "__main__":
    raise SystemExit(main())
