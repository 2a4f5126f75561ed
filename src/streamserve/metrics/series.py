"""The dashboard's charts: samples of a deployment's metrics hash over time, and requests/s and p50/p99 between
consecutive samples (pure functions; the leading scheduler takes the samples and metrics/history.py keeps them)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from streamserve.metrics.definitions import HANDLED, HANDLER_DURATION, REQUEST_DURATION, REQUESTS, Histogram
from streamserve.wire.messages import ReplyStatus

# The outcomes of handled requests that count as errors on the charts (a user's error, a deadline, a bad request, a
# dead letter; not a cancellation: nobody waited for it).
_HANDLED_ERRORS = frozenset(
    status.value
    for status in (
        ReplyStatus.USER_ERROR,
        ReplyStatus.DEADLINE_EXCEEDED,
        ReplyStatus.BAD_REQUEST,
        ReplyStatus.DEAD_LETTER,
    )
)


def sample(totals: Mapping[str, str], t_ms: int) -> dict[str, Any]:
    """One compact sample of a metrics hash (field -> number as text) at ``t_ms``."""
    requests = errors = handled = handled_errors = 0
    for name, value in totals.items():
        if (code := REQUESTS.label_of(name)) is not None:
            requests += int(value)
            errors += int(value) if code.startswith("5") else 0
        elif (outcome := HANDLED.label_of(name)) is not None:
            handled += int(value)
            handled_errors += int(value) if outcome in _HANDLED_ERRORS else 0
    return {
        "t": t_ms,
        "requests": requests,
        "errors": errors,
        "latency": _buckets(REQUEST_DURATION, totals),
        "handled": handled,
        "handled_errors": handled_errors,
        "handler": _buckets(HANDLER_DURATION, totals),
    }


def _buckets(histogram: Histogram, totals: Mapping[str, str]) -> list[int]:
    return [int(totals.get(name, 0)) for name in histogram.bucket_fields]


def series(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One point per pair of consecutive samples: time (ms), requests/s, errors/s, p50 and p99 in ms.

    Requests and errors are the gateways' or the replicas', whichever counted more (the replicas' hold the calls of
    the Python client and of handles besides HTTP's; the gateways', the requests refused before any replica took
    them); the latencies are end to end when the gateways saw any, else the handler's. A pair across a counter reset
    gives no point.
    """
    points = []
    for before, after in itertools.pairwise(samples):
        seconds = (after["t"] - before["t"]) / 1000
        http = after["requests"] - before["requests"]
        if http < 0 or after["handled"] < before["handled"]:
            continue
        use_http = http > 0
        count = max(http, after["handled"] - before["handled"])
        kind = "latency" if use_http else "handler"
        buckets = [a - b for a, b in zip(after[kind], before[kind], strict=True)]
        if seconds <= 0 or any(b < 0 for b in buckets):
            continue
        handled_errors = after.get("handled_errors", 0) - before.get("handled_errors", 0)  # (older samples: none)
        errors = max(0, after["errors"] - before["errors"], handled_errors)
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
