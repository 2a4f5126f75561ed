"""The dashboard's charts: samples of a deployment's metrics hash over time, and requests/s and p50/p99 between
consecutive samples (pure functions; the leading scheduler takes the samples and metrics/history.py keeps them)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from streamserve.metrics.definitions import HANDLED, HANDLER_DURATION, REQUEST_DURATION, REQUESTS, Histogram


def sample(totals: Mapping[str, str], t_ms: int) -> dict[str, Any]:
    """One compact sample of a metrics hash (field -> number as text) at ``t_ms``."""
    requests = errors = handled = 0
    for name, value in totals.items():
        if (code := REQUESTS.label_of(name)) is not None:
            requests += int(value)
            errors += int(value) if code.startswith("5") else 0
        elif HANDLED.label_of(name) is not None:
            handled += int(value)
    return {
        "t": t_ms,
        "requests": requests,
        "errors": errors,
        "latency": _buckets(REQUEST_DURATION, totals),
        "handled": handled,
        "handler": _buckets(HANDLER_DURATION, totals),
    }


def _buckets(histogram: Histogram, totals: Mapping[str, str]) -> list[int]:
    return [int(totals.get(name, 0)) for name in histogram.bucket_fields]


def series(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One point per pair of consecutive samples: time (ms), requests/s, errors/s, p50 and p99 in ms.

    Requests are the gateways' when there were any, else the replicas' (the Python client's calls); the
    latencies likewise (end to end, else the handler's). A pair across a counter reset gives no point.
    """
    points = []
    for before, after in itertools.pairwise(samples):
        seconds = (after["t"] - before["t"]) / 1000
        http = after["requests"] - before["requests"]
        if http < 0 or after["handled"] < before["handled"]:
            continue
        use_http = http > 0
        count = http if use_http else after["handled"] - before["handled"]
        kind = "latency" if use_http else "handler"
        buckets = [a - b for a, b in zip(after[kind], before[kind], strict=True)]
        if seconds <= 0 or count < 0 or any(b < 0 for b in buckets):
            continue
        errors = max(0, after["errors"] - before["errors"]) if use_http else 0
        histogram = REQUEST_DURATION if use_http else HANDLER_DURATION
        points.append(
            {
                "t": after["t"],
                "rps": round(count / seconds, 2),
                "errors_per_s": round(errors / seconds, 2),
                "p50_ms": _ms(quantile(histogram, buckets, 0.5)),
                "p99_ms": _ms(quantile(histogram, buckets, 0.99)),
            }
        )
    return points


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def quantile(histogram: Histogram, counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of observations counted in ``histogram``'s buckets (not cumulative; +Inf last), by linear
    interpolation within the bucket it falls in, as Prometheus's histogram_quantile; None with no observations.
    One in the +Inf bucket is reported as the highest finite bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index == len(histogram.bounds):
                return histogram.bounds[-1]
            lower = histogram.bounds[index - 1] if index else 0.0
            upper = histogram.bounds[index]
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    return histogram.bounds[-1]
