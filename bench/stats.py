"""Statistics over measurements: percentiles, one measured phase, repetitions as a median and its min-max range."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (nan when empty)."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements and their min-max range."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))

    def fmt(self, digits: int = 0) -> str:
        """``785 (770-800)``: the median, then the range over the repetitions."""
        if self.n == 0:
            return "n/a"
        return f"{self.median:.{digits}f} ({self.lo:.{digits}f}-{self.hi:.{digits}f})"


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


@dataclass
class Sample:
    """One measured phase of a closed-loop load: answers, errors, time and the latency of each answer."""

    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_error: str = ""

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def p(self, q: float) -> float:
        """The q-quantile of the latencies, in milliseconds."""
        return 1000 * percentile(sorted(self.latencies), q)

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "ok": self.ok,
            "errors": self.errors,
            "seconds": self.seconds,
            "rps": self.rps,
            "p50_ms": 1000 * percentile(lat, 0.5),
            "p99_ms": 1000 * percentile(lat, 0.99),
            "first_error": self.first_error,
        }


@dataclass(frozen=True)
class Summary:
    """Repetitions of one row, reduced: throughput, p50 and p99 as medians with their spread."""

    rps: Spread
    p50_ms: Spread
    p99_ms: Spread
    errors: int

    @classmethod
    def of(cls, samples: Sequence[dict[str, Any]]) -> Summary:
        return cls(
            Spread.of([s["rps"] for s in samples]),
            Spread.of([s["p50_ms"] for s in samples]),
            Spread.of([s["p99_ms"] for s in samples]),
            sum(int(s["errors"]) for s in samples),
        )
