"""What seeing inside costs: the HTTP bench's streamserve target with metrics and the access log off, with
metrics on, and with both on (the default), alternated in one session so that drift hits every setting alike.

    .venv/bin/python -m bench.observability_bench [--quick] [--reps 3] [--duration 10] [--out FILE]
"""

from __future__ import annotations

from bench.options import Options
from bench.section import Section, verdict
from bench.setting_turns import IN_TURNS, measure_in_turns, table_of
from bench.standalone import standalone
from bench.stats import ratio

SETTINGS: dict[str, dict[str, str]] = {
    "metrics off, access log off": {"STREAMSERVE_METRICS": "0", "STREAMSERVE_ACCESS_LOG": "0"},
    "metrics on, access log off": {"STREAMSERVE_METRICS": "1", "STREAMSERVE_ACCESS_LOG": "0"},
    "metrics on, access log on (default)": {"STREAMSERVE_METRICS": "1", "STREAMSERVE_ACCESS_LOG": "1"},
}
BASELINE, METRICS, BOTH = SETTINGS
# The issue's budget: HTTP figures with metrics on within 5% of metrics off.
BUDGET = 0.05


def run(opts: Options) -> Section:
    found = measure_in_turns(opts, SETTINGS)
    section = Section("observability", "What metrics and the access log cost on the HTTP path")
    section.setup = [
        IN_TURNS,
        "Metrics: the gateway and replica count into dicts and add them to Redis once a second. "
        "Access log: one line per request to the gateway's stderr (here a file).",
    ]
    section.body = table_of(found)
    base = found[BASELINE]
    for name in (METRICS, BOTH):
        r = ratio(found[name][32].rps.median, base[32].rps.median)
        section.verdicts.append(
            f"{name} / off, req/s at c=32: **{r:.3f}** (budget >= {1 - BUDGET:.2f}: {verdict(r >= 1 - BUDGET)})."
        )
        diff_us = (found[name][1].p50_ms.median - base[1].p50_ms.median) * 1000
        section.verdicts.append(f"{name} - off, p50 at c=1: **{diff_us:+.0f} µs**.")
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
