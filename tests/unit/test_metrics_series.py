"""The dashboard's charts: samples of the metrics hash, and requests/s and quantiles between them."""

from __future__ import annotations

import pytest

from streamserve.metrics.definitions import HANDLER_DURATION, REQUEST_DURATION
from streamserve.metrics.series import quantile, sample, series


def totals(requests: dict[str, int], latency: dict[float, int], handled: int = 0) -> dict[str, str]:
    fields = {f"requests_total|code={code}": str(n) for code, n in requests.items()}
    for bound, n in latency.items():
        fields[f"request_duration_seconds|le={bound!r}"] = str(n)
    if handled:
        fields["handled_requests_total|outcome=ok"] = str(handled)
        fields["handler_duration_seconds|le=0.01"] = str(handled)
    return fields


def test_quantiles_interpolate_within_the_bucket_like_prometheus() -> None:
    counts = [0] * (len(REQUEST_DURATION.bounds) + 1)
    i_1ms, i_2_5ms = REQUEST_DURATION.bounds.index(0.001), REQUEST_DURATION.bounds.index(0.0025)
    counts[i_1ms], counts[i_2_5ms] = 50, 50  # half in (0.5 ms, 1 ms], half in (1 ms, 2.5 ms]
    assert quantile(REQUEST_DURATION, counts, 0.5) == pytest.approx(0.001)
    assert quantile(REQUEST_DURATION, counts, 0.25) == pytest.approx(0.00075)
    assert quantile(REQUEST_DURATION, counts, 0.99) == pytest.approx(0.001 + 0.0015 * 49 / 50)
    assert quantile(REQUEST_DURATION, [0] * len(counts), 0.5) is None
    beyond = [0] * len(counts)
    beyond[-1] = 3  # only in +Inf: the highest finite bound, as Prometheus says
    assert quantile(REQUEST_DURATION, beyond, 0.99) == REQUEST_DURATION.bounds[-1]


def test_series_gives_rates_and_latencies_between_samples() -> None:
    a = sample(totals({"200": 100, "503": 0}, {0.001: 100}), 0)
    b = sample(totals({"200": 150, "503": 10}, {0.001: 130, 0.005: 30}), 5000)
    [point] = series([a, b])
    assert point["t"] == 5000
    assert point["rps"] == 12.0 and point["errors_per_s"] == 2.0
    assert point["p50_ms"] == pytest.approx(0.5 + 0.5 * 30 / 30, rel=1e-3)  # 30th of 60: top of the 1 ms bucket
    assert 1.0 < point["p99_ms"] <= 5.0


def test_client_only_traffic_charts_the_replicas_figures() -> None:
    a = sample(totals({}, {}, handled=10), 0)
    b = sample(totals({}, {}, handled=30), 2000)
    [point] = series([a, b])
    assert point["rps"] == 10.0 and point["p50_ms"] == pytest.approx(HANDLER_DURATION.bounds[4] * 1000 * 0.75)


def test_a_counter_reset_gives_no_point() -> None:
    a = sample(totals({"200": 100}, {0.001: 100}), 0)
    b = sample(totals({"200": 5}, {0.001: 5}), 5000)  # the hash was deleted and made again
    c = sample(totals({"200": 15}, {0.001: 15}), 10000)
    assert [p["t"] for p in series([a, b, c])] == [10000]


def test_errors_and_calls_the_gateways_never_saw_are_charted_from_the_replicas_figures() -> None:
    """Calls through handles or the Python client reach no gateway: their errors count, and beside HTTP traffic
    their calls do too (the charts showed 0 errors/s for a child whose every call failed)."""

    def replicas(ok: int, user_error: int, deadline: int, cancelled: int) -> dict[str, str]:
        outcomes = {"ok": ok, "user_error": user_error, "deadline_exceeded": deadline, "cancelled": cancelled}
        return {f"handled_requests_total|outcome={name}": str(n) for name, n in outcomes.items()}

    a = sample(replicas(0, 0, 0, 0), 0)
    b = sample(replicas(2, 2, 2, 4), 2000)  # cancelled: nobody waited, no error
    [point] = series([a, b])
    assert (point["rps"], point["errors_per_s"]) == (5.0, 2.0)
    # One HTTP call beside four through handles: five calls, not one.
    c = sample({**totals({"200": 1}, {0.001: 1}), **replicas(7, 2, 2, 4)}, 4000)
    [_, mixed] = series([a, b, c])
    assert mixed["rps"] == 2.5
    old = {k: v for k, v in a.items() if k != "handled_errors"}  # a sample taken before handled_errors was
    assert series([old, b])[0]["errors_per_s"] == 2.0
