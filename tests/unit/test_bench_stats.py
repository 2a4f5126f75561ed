"""The benchmark's arithmetic (medians, spreads, percentiles, option scaling); never a timing."""

from __future__ import annotations

import argparse
import math

from bench.common import Options, Sample, Spread, Summary, md_table, percentile, ratio


def test_spread_is_median_and_range() -> None:
    spread = Spread.of([3.0, 1.0, 2.0])
    assert (spread.median, spread.lo, spread.hi, spread.n) == (2.0, 1.0, 3.0, 3)
    assert spread.fmt(1) == "2.0 (1.0-3.0)"
    assert Spread.of([math.nan]).fmt() == "n/a"


def test_nearest_rank_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert math.isnan(percentile([], 0.5))


def test_summary_of_samples() -> None:
    samples = [Sample(ok=10, errors=e, seconds=1.0, latencies=[0.001] * 10).to_json() for e in (0, 1, 2)]
    summary = Summary.of(samples)
    assert summary.rps.median == 10.0
    assert summary.p50_ms.median == 1.0
    assert summary.errors == 3


def test_ratio_and_table() -> None:
    assert ratio(1.0, 2.0) == 0.5
    assert math.isnan(ratio(1.0, 0.0))
    assert md_table(["a", "b"], [["x", "1"]]) == ["| a | b |", "| --- | ---: |", "| x | 1 |"]


def test_quick_scales_phases_down() -> None:
    parser = argparse.ArgumentParser()
    Options.add_arguments(parser)
    quick = Options.from_args(parser.parse_args(["--quick"]))
    full = Options.from_args(parser.parse_args([]))
    assert quick.quick and quick.duration_s < full.duration_s and quick.warmup_s < full.warmup_s
    assert quick.reps == full.reps == 3
