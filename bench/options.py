"""How long and how often every bench measures, and where an optional peer lives: the options `bench/run` and each
bench alone share."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

# The environment variable that may name Ray's Python (--ray-python).
RAY_PYTHON_VAR = "BENCH_RAY_PYTHON"


@dataclass(frozen=True)
class Options:
    """How long and how often to measure; ``quick`` scales everything down for a smoke run."""

    duration_s: float = 10.0
    warmup_s: float = 2.0
    reps: int = 3
    quick: bool = False
    max_requests: int = 1_000_000  # a cap on the requests of one measured phase: every loop is bounded in count too
    # The Python of a virtualenv of its own with ray[serve] (the stream bench's peer); "" skips Ray.
    ray_python: str = ""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quick", action="store_true", help="smoke run: short phases, small counts")
        parser.add_argument("--duration", type=float, help="seconds measured per phase (default 10; quick 1.5)")
        parser.add_argument("--warmup", type=float, help="seconds of warm-up before each phase (default 2; quick 0.5)")
        parser.add_argument(
            "--reps", type=int, default=3, help="repetitions of every measurement (default 3; a result needs >= 3)"
        )
        parser.add_argument(
            "--ray-python",
            default=os.environ.get(RAY_PYTHON_VAR, ""),
            help=f"the stream bench's Ray Serve peer: the python of a virtualenv with ray[serve] (default "
            f"${RAY_PYTHON_VAR}; none: Ray is skipped). See bench/README.md",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        if args.reps < 1:
            raise SystemExit("--reps must be >= 1")
        duration = args.duration if args.duration is not None else (1.5 if args.quick else 10.0)
        warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0)
        return cls(
            duration_s=duration, warmup_s=warmup, reps=args.reps, quick=args.quick, ray_python=args.ray_python or ""
        )

    def describe(self) -> str:
        kind = "quick smoke run" if self.quick else "full run"
        reps = f"{self.reps} repetition{'s' if self.reps != 1 else ''}"
        return f"{kind}: {reps}, {self.warmup_s:g} s warm-up + {self.duration_s:g} s per phase"
