"""RESULTS.md: the run's facts (machine, load, commit, versions, options), then each bench's section.

A run rewrites the sections it measured. Every other section of the file it replaces (a bench it did
not run or skipped, e.g. ``embed`` without the embed extra, or one written by a standalone script such
as ``cpu_probe.py``) is kept below, marked as not measured by this run, so that a partial run never
throws away recorded figures.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence

from bench.machine import RunLoad, machine
from bench.options import Options
from bench.section import Section
from bench.versions import git_revision, versions

ALL = ("http", "client", "scaling", "control", "memory", "embed", "stream")

# Bench -> titles of older sections that its section replaces (the pre-suite `http_bench.py` one).
SUPERSEDED = {"http": ("HTTP echo: streamserve gateway vs bare FastAPI",)}

KEPT_MARK = "> Not measured by the run above: kept from an earlier run"
PROFILE_TITLE = "Where the time goes"

# Other work using more than this many cores on average during the run marks it as taken on a busy machine.
# The load average before the run is shown but decides nothing: it trails by a minute, so work that
# ended just before the run still shows in it.
OTHER_CORES = 0.25

PROFILE_NOTE = """\
## Where the time goes

To fill in from a profile taken on a quiet machine where a target above is missed: record the gateway
(`python -m streamserve gateway`) and the noop replica (`python -m streamserve worker noop ...`) while the HTTP
c=32 phase runs, see bench/README.md, "Profiling". A run does not fill this in by itself.
"""


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def split_sections(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines before the first ``## `` heading, and (title, lines) of every ``## `` section."""
    head: list[str] = []
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            found.append((line[3:].strip(), [line]))
        elif found:
            found[-1][1].append(line)
        else:
            head.append(line)
    return head, found


def kept_sections(previous: str, sections: Sequence[Section]) -> list[str]:
    """The sections of ``previous`` that this run did not rewrite, each marked as kept (once)."""
    head, old = split_sections(previous)
    measured = [s for s in sections if not s.skipped]
    rewritten = {s.title for s in measured} | {PROFILE_TITLE}
    rewritten |= {title for s in measured for title in SUPERSEDED.get(s.key, ())}
    run = re.search(r"Written by `bench/run` on ([^;]+);", "\n".join(head))
    commit = re.search(r"^- streamserve at git (.+)\.$", "\n".join(head), re.MULTILINE)
    kept: list[str] = []
    for title, lines in old:
        if title in rewritten or title.endswith(": FAILED"):
            continue
        body = "\n".join(lines[1:])
        if KEPT_MARK not in body:
            own_facts = "Written by" in body or re.search(r"\b20\d\d-\d\d-\d\d\b", body)
            where = ""
            if run is not None and not own_facts:
                where = f" (`bench/run` on {run.group(1)}, git {commit.group(1) if commit else 'unknown'})"
            lines = [lines[0], "", KEPT_MARK + where + ".", *lines[1:]]
        kept.append("\n".join(lines).rstrip("\n") + "\n")
    return kept


def profile_section(previous: str | None) -> str:
    """The "Where the time goes" section: the one already filled in, else the note on how to fill it in."""
    if previous:
        for title, lines in split_sections(previous)[1]:
            text = "\n".join(lines).rstrip("\n") + "\n"
            if title == PROFILE_TITLE and text.strip() != PROFILE_NOTE.strip():
                return text
    return PROFILE_NOTE


def render(
    sections: Sequence[Section],
    opts: Options,
    load: RunLoad,
    ran: Sequence[str],
    previous: str | None = None,
) -> str:
    """The whole of RESULTS.md; ``previous`` is the file it replaces, whose other sections are kept."""
    found = versions()
    skipped = [s.key for s in sections if s.skipped]
    kept = kept_sections(previous, sections) if previous else []
    loaded = load.other_cores > OTHER_CORES
    lines = ["# Benchmark results", ""]
    if loaded or opts.quick or opts.reps < 3:
        why = []
        if loaded:
            why.append(
                f"the machine was busy with other work (load average {load.before} before the run; other work "
                f"used {load.other_cores:.2f} cores on average during it)"
            )
        if opts.quick:
            why.append("`--quick` phases are too short to compare")
        if opts.reps < 3:
            why.append(f"{opts.reps} repetition{'s give' if opts.reps != 1 else ' gives'} no median of 3")
        lines += [
            f"> **{'Smoke run' if opts.quick or opts.reps < 3 else 'Taken on a busy machine'}, not a result**: "
            f"{'; '.join(why)}.",
            "> It shows that the harness works. Run `bench/run` (no `--quick`) on a quiet machine for figures.",
            "",
        ]
    lines += [
        f"Written by `bench/run` on {utc_now()}; {opts.describe()}. Every figure below comes from this one run on",
        "one machine, the systems compared side by side"
        + (", except in the sections marked as kept from an earlier run" if kept else "")
        + "; see bench/README.md for what is measured and why it is fair.",
        "Cells read `median (min-max)` over the repetitions.",
        "",
        f"- Machine: {machine()}.",
        f"- Load average (1, 5, 15 min) before the run: {load.before}; after: {load.after} (the run's own load)."
        f" CPU used by other work during the run: {load.other_cores:.2f} cores on average.",
        f"- streamserve at git {git_revision()}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in found.items()) + ".",
        f"- Benches run: {', '.join(b for b in ran if b not in skipped) or 'none'}"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
        + (f"; not run: {', '.join(b for b in ALL if b not in ran)}" if set(ALL) - set(ran) else "")
        + ".",
        "",
    ]
    kept_titles = {text.splitlines()[0][3:].strip() for text in kept}
    for section in sections:
        if not (section.skipped and section.title in kept_titles):  # else its recorded figures follow below
            lines.append(section.markdown())
    lines += kept
    lines.append(profile_section(previous))
    return "\n".join(lines)
