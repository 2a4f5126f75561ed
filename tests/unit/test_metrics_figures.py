"""The metrics' pure parts: counting into deltas, rendering the Redis totals in Prometheus's text format."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from streamserve.control.status import DeploymentStatus, ReplicaStatus
from streamserve.metrics.definitions import BATCH_SIZE, HANDLED, REQUEST_DURATION, REQUESTS
from streamserve.metrics.exposition import _Families, families
from streamserve.metrics.figures import Figures
from streamserve.metrics.flusher import MetricsFlusher
from streamserve.transport.connections import RETRYABLE_ERRORS
from streamserve.wire.keys import Keys


def test_a_value_lands_in_the_first_bucket_whose_bound_holds_it() -> None:
    assert REQUEST_DURATION.bucket_fields[REQUEST_DURATION.bucket_of(0.001)] == "request_duration_seconds|le=0.001"
    assert REQUEST_DURATION.bucket_fields[REQUEST_DURATION.bucket_of(0.0011)] == "request_duration_seconds|le=0.0025"
    assert REQUEST_DURATION.bucket_fields[REQUEST_DURATION.bucket_of(1e9)] == "request_duration_seconds|le=+Inf"
    assert BATCH_SIZE.bucket_fields[BATCH_SIZE.bucket_of(3)] == "batch_size|le=4.0"


def test_figures_add_up_until_taken_and_put_back_merges() -> None:
    figures = Figures()
    for _ in range(3):
        figures.count("a", REQUESTS, "200")
    figures.count("b", HANDLED, "ok")
    figures.observe("a", REQUEST_DURATION, 0.5)
    taken = figures.take()
    assert taken == {
        "a": {"requests_total|code=200": 3, "request_duration_seconds|le=0.5": 1, "request_duration_seconds|sum": 0.5},
        "b": {"handled_requests_total|outcome=ok": 1},
    }
    assert figures.take() == {}
    figures.count("a", REQUESTS, "200")
    figures.put_back(taken)
    assert figures.take()["a"]["requests_total|code=200"] == 4


def render(statuses: list[DeploymentStatus], totals: dict[str, dict[str, str]], leading: bool = True) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families(statuses, totals, leading))))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def status(name: str, **fields: object) -> DeploymentStatus:
    base: dict[str, object] = dict(
        route_prefix=f"/{name}", version="v1", health="HEALTHY", message="", target=2, running=1, starting=1,
        stopping=0, queued=4, in_flight=3, dead_letters=1, replicas=[],
    )  # fmt: skip
    return DeploymentStatus(name=name, **{**base, **fields})  # type: ignore[arg-type]


def replica(state: str) -> ReplicaStatus:
    return ReplicaStatus("x#1", state, "v1", 1, "h", 0, 0.1, "")


def test_histograms_are_cumulative_with_count_and_sum() -> None:
    totals = {
        "a": {
            "request_duration_seconds|le=0.001": "2",
            "request_duration_seconds|le=0.5": "1",
            "request_duration_seconds|le=+Inf": "1",
            "request_duration_seconds|sum": "200.25",
        }
    }
    samples = render([], totals)
    assert samples[("streamserve_request_duration_seconds_bucket", (("deployment", "a"), ("le", "0.001")))] == 2
    assert samples[("streamserve_request_duration_seconds_bucket", (("deployment", "a"), ("le", "0.25")))] == 2
    assert samples[("streamserve_request_duration_seconds_bucket", (("deployment", "a"), ("le", "0.5")))] == 3
    assert samples[("streamserve_request_duration_seconds_bucket", (("deployment", "a"), ("le", "+Inf")))] == 4
    assert samples[("streamserve_request_duration_seconds_count", (("deployment", "a"),))] == 4
    assert samples[("streamserve_request_duration_seconds_sum", (("deployment", "a"),))] == 200.25


def test_gauges_come_from_the_status_and_every_state_is_shown() -> None:
    statuses = [status("a", replicas=[replica("RUNNING"), replica("STARTING")]), status("b", health="UNHEALTHY")]
    samples = render(statuses, {"a": {"requests_total|code=503": "7"}}, leading=False)
    assert samples[("streamserve_requests_total", (("code", "503"), ("deployment", "a")))] == 7
    assert samples[("streamserve_queued_requests", (("deployment", "a"),))] == 4
    assert samples[("streamserve_in_flight_requests", (("deployment", "a"),))] == 3
    assert samples[("streamserve_target_replicas", (("deployment", "a"),))] == 2
    assert samples[("streamserve_dead_letters", (("deployment", "a"),))] == 1
    assert samples[("streamserve_replicas", (("deployment", "a"), ("state", "RUNNING")))] == 1
    assert samples[("streamserve_replicas", (("deployment", "a"), ("state", "STARTING")))] == 1
    assert samples[("streamserve_replicas", (("deployment", "a"), ("state", "STOPPING")))] == 0
    assert samples[("streamserve_deployment_healthy", (("deployment", "a"),))] == 1
    assert samples[("streamserve_deployment_healthy", (("deployment", "b"),))] == 0
    assert samples[("streamserve_scheduler_leading", ())] == 0


async def test_a_flush_that_fails_keeps_its_figures_for_the_next_one() -> None:
    redis = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # nothing listens on port 1
    figures = Figures()
    figures.count("a", REQUESTS, "200")
    try:
        with pytest.raises(RETRYABLE_ERRORS):
            await MetricsFlusher(redis, Keys(), figures).flush()
    finally:
        await redis.aclose()
    assert figures.take() == {"a": {"requests_total|code=200": 1}}
