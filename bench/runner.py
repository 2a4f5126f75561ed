"""`bench/run`: every bench (or a subset) in one run, then RESULTS.md with the run's facts and every table.

bench/run [--quick] [--only http,client] [--skip memory] [--reps 3] [--ray-python PATH] [--out bench/RESULTS.md]

``embed`` runs only where the ``embed`` extra (torch) is installed; elsewhere it is skipped and the
embedding figures already in the file are kept (bench/report.py). ``stream`` compares with Ray Serve only when given
Ray's own virtualenv (``--ray-python``); without it, its Ray rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from bench import client_bench, control_bench, embed_bench, http_bench, memory_bench, scaling_bench, stream_bench
from bench.machine import RunLoad
from bench.options import Options
from bench.report import ALL, render
from bench.section import Section
from bench.standalone import stop_on_sigterm
from tests.harness.paths import ROOT

BENCHES: dict[str, Callable[[Options], Section]] = {
    "http": http_bench.run,
    "client": client_bench.run,
    "scaling": scaling_bench.run,
    "control": control_bench.run,
    "memory": memory_bench.run,
    "embed": embed_bench.run,
    "stream": stream_bench.run,
}
assert tuple(BENCHES) == ALL


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    t0 = time.monotonic()
    print(f"== {label}", flush=True)
    try:
        yield
    finally:
        print(f"== {label}: {time.monotonic() - t0:.0f} s", flush=True)


def names(value: str) -> list[str]:
    chosen = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in BENCHES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown bench {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description="run the benchmarks and rewrite RESULTS.md")
    Options.add_arguments(parser)
    parser.add_argument("--only", type=names, help=f"comma-separated subset of: {', '.join(BENCHES)}")
    parser.add_argument("--skip", type=names, default=[], help="comma-separated benches not to run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md", help="markdown file to write")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    opts = Options.from_args(args)
    chosen = [n for n in (args.only or list(BENCHES)) if n not in args.skip]
    load = RunLoad()
    sections: list[Section] = []
    failed = []
    t0 = time.monotonic()
    try:
        for name in chosen:
            with timed(f"bench {name}"):
                try:
                    sections.append(BENCHES[name](opts))
                except (Exception, KeyboardInterrupt) as exc:
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    traceback.print_exc()
                    failed.append(name)
                    failure = Section(name, f"{name}: FAILED")
                    failure.body = ["```", f"{type(exc).__name__}: {exc}"[:3000], "```"]
                    sections.append(failure)
    except KeyboardInterrupt:
        print("bench: interrupted; what it started is stopped; RESULTS.md left as it was", file=sys.stderr)
        return 130
    previous = args.out.read_text() if args.out.exists() else None
    text = render(sections, opts, load.finish(), chosen, previous)
    args.out.write_text(text)
    print(f"\nall done in {time.monotonic() - t0:.0f} s; written to {args.out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
