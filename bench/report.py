"""RESULTS.md: the run's facts (machine, load, commit, versions, options), then each bench's section."""

from __future__ import annotations

from collections.abc import Sequence

from bench.common import Options, Section, git_revision, machine, utc_now, versions

ALL = ("http", "client", "scaling", "control", "memory")

LOADED = 1.0
"""A 1-minute load average above this before or after the run marks it as taken on a busy machine."""

PROFILE_NOTE = """\
## Where the time goes

To fill in from a profile taken on a quiet machine where a target above is missed: record the gateway
(`python -m app`) and the noop replica (`python -m workers noop ...`) while the HTTP c=32 phase runs, see
bench/README.md, "Profiling". A run does not fill this in by itself.
"""


def render(sections: Sequence[Section], opts: Options, load_before: str, load_after: str, ran: Sequence[str]) -> str:
    found = versions()
    loaded = max(float(load_before.split()[0]), float(load_after.split()[0])) > LOADED
    lines = ["# Benchmark results", ""]
    if loaded or opts.quick:
        why = []
        if loaded:
            why.append(f"the machine was busy with other work (load average {load_before} before, {load_after} after)")
        if opts.quick:
            why.append("`--quick` phases are too short to compare")
        lines += [
            f"> **Smoke run{' on a loaded machine' if loaded else ''}, not a result**: {'; '.join(why)}.",
            "> It shows that the harness works. Run `bench/run` (no `--quick`) on a quiet machine for figures.",
            "",
        ]
    lines += [
        f"Written by `bench/run` on {utc_now()}; {opts.describe()}. Every figure below comes from this one run on",
        "one machine, the systems compared side by side; see bench/README.md for what is measured and why it is fair.",
        "Cells read `median (min-max)` over the repetitions.",
        "",
        f"- Machine: {machine()}.",
        f"- Load average (1, 5, 15 min) before the run: {load_before}; after: {load_after}.",
        f"- streamserve at git {git_revision()}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in found.items()) + ".",
        f"- Benches run: {', '.join(ran)}"
        + (f"; not run: {', '.join(b for b in ALL if b not in ran)}" if set(ALL) - set(ran) else "")
        + ".",
        "",
    ]
    for section in sections:
        lines.append(section.markdown())
    lines.append(PROFILE_NOTE)
    return "\n".join(lines)
