"""``python -m bench.X``: one bench run alone, its section printed (or written into a RESULTS-style file)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.machine import RunLoad
from bench.options import Options
from bench.report import render
from bench.section import Section

T = TypeVar("T")


def stop_on_sigterm() -> None:
    """SIGTERM (and SIGINT, even when started in the background) raise KeyboardInterrupt: one clean stop path."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def standalone(run: Callable[[Options], Section], description: str, argv: list[str] | None = None) -> int:
    """``python -m bench.X [--quick] [--out FILE]``: run one bench and print (or write) its section."""
    parser = argparse.ArgumentParser(description=description)
    Options.add_arguments(parser)
    parser.add_argument("--out", type=Path, help="also write the section, with the run's facts, to this file")
    args = parser.parse_args(argv)
    opts = Options.from_args(args)
    measured = run_alone(lambda: run(opts))
    if measured is None:
        return 130
    section, load = measured
    print()
    print(section.markdown())
    if args.out is not None:
        previous = args.out.read_text() if args.out.exists() else None
        args.out.write_text(render([section], opts, load, [section.key], previous))
        print(f"written to {args.out}")
    return 0


def run_alone(work: Callable[[], T]) -> tuple[T, RunLoad] | None:
    """Run a bench's ``work`` as its own program: what the machine's other work used meanwhile comes with its result;
    SIGTERM or Ctrl-C stop it (everything it started is stopped on the way out) and give None."""
    stop_on_sigterm()
    load = RunLoad()
    try:
        result = work()
    except KeyboardInterrupt:
        print("bench: interrupted; what it started is stopped", file=sys.stderr)
        return None
    return result, load.finish()
