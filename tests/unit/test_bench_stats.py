"""The benchmark's arithmetic (medians, spreads, percentiles, option scaling) and RESULTS.md upkeep; never a timing."""

from __future__ import annotations

import argparse
import math

from bench.options import Options
from bench.report import KEPT_MARK, PROFILE_NOTE, kept_sections, profile_section
from bench.section import Section, md_table
from bench.stats import Sample, Spread, Summary, percentile, ratio


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


OLD_RESULTS = """\
# Benchmark results

Written by `bench/run` on 2026-11-01 10:00 UTC; full run: 3 repetitions, 2 s warm-up + 10 s per phase.

- streamserve at git abc1234.

## HTTP echo: streamserve gateway vs bare FastAPI

Written by `bench/http_bench.py` on 2026-10-01 08:00 UTC.

## Client path (no HTTP): round trips

| target | round trips/s |

## Sentence embeddings: batching off vs on

Written by `bench/embed_bench.py` on 2026-10-02 09:00 UTC.

## Where the time goes

The gateway spends its time in X.
"""


def test_a_run_keeps_the_sections_it_did_not_measure() -> None:
    http = Section("http", "HTTP path: noop deployment vs bare FastAPI vs FastAPI + Celery")
    embed = Section("embed", "Sentence embeddings: batching off vs on", skipped=True)
    kept = kept_sections(OLD_RESULTS, [http, embed])
    titles = [text.splitlines()[0] for text in kept]
    # http replaces the old echo section; the profile is handled apart; the skipped embed keeps its figures.
    assert titles == ["## Client path (no HTTP): round trips", "## Sentence embeddings: batching off vs on"]
    assert "(`bench/run` on 2026-11-01 10:00 UTC, git abc1234)" in kept[0]  # its facts were in the old header
    assert kept[1].count(KEPT_MARK) == 1 and "bench/run` on" not in kept[1]  # it has its own facts
    assert kept_sections("\n".join(kept), [http]) == kept  # marked once, however often it is carried over


def test_a_filled_in_profile_section_is_kept() -> None:
    assert profile_section(OLD_RESULTS).startswith("## Where the time goes\n\nThe gateway spends")
    assert profile_section(None) == PROFILE_NOTE


def test_embed_section_from_phases() -> None:
    from bench.embed_bench import EmbedRun, Phase, section

    phases = [
        Phase("off", done=30, model_calls=30, sentences=30, elapsed_s=1.0),
        Phase("on", done=90, model_calls=6, sentences=90, elapsed_s=1.0),
    ]
    found = section(phases, EmbedRun(repeats=1, phase_s=1.0))
    assert found.title == "Sentence embeddings: batching off vs on" and not found.skipped
    assert found.body[2] == "| off | 30.0 | 30.0-30.0 | 30 | 1.0 | 0 |"
    assert found.body[3] == "| on | 90.0 | 90.0-90.0 | 90 | 15.0 | 0 |"
    assert found.verdicts[0].startswith("Batching on / off (ratio of the medians): **3.00x**")
