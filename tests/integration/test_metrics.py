"""``GET /metrics``: real gateway processes, an in-process replica, the real redis-server; parsed with
prometheus_client's own parser, as Prometheus would read it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from streamserve.client import AsyncClient
from streamserve.metrics.definitions import REQUESTS, TENANT_REQUESTS
from streamserve.metrics.figures import Figures
from streamserve.metrics.flusher import MetricsFlusher
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import RemoteError, RequestTimeoutError
from streamserve.wire.tenants import OTHER_TENANTS, TENANT_LABEL_CAP
from tests import deployments
from tests.harness.farm import gateway_process
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def eventually(port: int, check: Callable[[Samples], bool], timeout_s: float = 10.0) -> Samples:
    """Scrape until ``check`` holds (figures reach Redis once a second), bounded."""
    last: list[Samples] = [{}]

    async def holds() -> bool:
        last[0] = await asyncio.to_thread(scrape, port)
        return check(last[0])

    await wait_for_async(holds, timeout_s, lambda: f"metrics never got there: {last[0]}", interval_s=0.1)
    return last[0]


async def test_any_gateway_shows_the_whole_farm_and_the_figures_move_with_traffic(
    start_replica: StartReplica, client: AsyncClient, redis_url: str, tmp_path: Path
) -> None:
    replica = await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path) as first, gateway_process(redis_url, tmp_path) as second:
        before = await asyncio.to_thread(scrape, first)
        assert value(before, "streamserve_requests_total", deployment="rec", code="200") is None
        assert value(before, "streamserve_target_replicas", deployment="rec") == 1
        assert value(before, "streamserve_queued_requests", deployment="rec") == 0
        assert value(before, "streamserve_scheduler_leading") == 0  # no scheduler in this test

        async with httpx.AsyncClient() as http:
            for port, calls in ((first, 5), (second, 3)):
                for i in range(calls):
                    assert (await http.post(f"http://127.0.0.1:{port}/rec", json=i)).status_code == 200
            assert (await http.post(f"http://127.0.0.1:{second}/rec", content=b"{bad")).status_code == 400
            bad_id = {
                "X-Request-ID": "bad id!"
            }  # (refused before its route is looked at: counted under it all the same)
            assert (await http.post(f"http://127.0.0.1:{second}/rec", json=1, headers=bad_id)).status_code == 400
        for i in range(4):  # the Python client's calls: counted by the replica's figures only
            await client.call("rec", i)
        with pytest.raises(RemoteError):
            await client.call("rec", 1, method="boom")

        def counted(s: Samples) -> bool:
            """Every process has flushed (each does once a second, on its own clock)."""
            return (
                value(s, "streamserve_handled_requests_total", deployment="rec", outcome="ok") == 12
                and value(s, "streamserve_handled_requests_total", deployment="rec", outcome="user_error") == 1
                and value(s, "streamserve_requests_total", deployment="rec", code="200") == 8
                and value(s, "streamserve_requests_total", deployment="rec", code="400") == 2
            )

        after = await eventually(first, counted)  # 200: 5 through one gateway and 3 through the other
        assert value(after, "streamserve_request_duration_seconds_count", deployment="rec") == 10
        assert value(after, "streamserve_handler_duration_seconds_count", deployment="rec") == 13
        assert value(after, "streamserve_handler_duration_seconds_bucket", deployment="rec", le="+Inf") == 13
        assert 0 < value(after, "streamserve_request_duration_seconds_sum", deployment="rec") < 9 * 5  # type: ignore[operator]
        # The other gateway shows the same farm.
        assert counted(await asyncio.to_thread(scrape, second))
    assert replica.replica_id


async def test_queued_and_in_flight_are_read_from_redis_at_scrape(
    start_replica: StartReplica, gate: None, client: AsyncClient, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(name="held", import_path="tests.deployments:gate", max_ongoing_requests=2)
    with gateway_process(redis_url, tmp_path) as port:
        calls = [client.submit("held", i) for i in range(5)]

        def held(s: Samples) -> bool:
            return value(s, "streamserve_in_flight_requests", deployment="held") == 2

        samples = await eventually(port, held)
        assert value(samples, "streamserve_queued_requests", deployment="held") == 3
        deployments.GATE.set()
        assert sorted(await asyncio.gather(*calls)) == list(range(5))
        samples = await eventually(port, lambda s: value(s, "streamserve_in_flight_requests", deployment="held") == 0)
        assert value(samples, "streamserve_queued_requests", deployment="held") == 0


async def test_batched_deployments_report_their_batch_sizes(
    start_replica: StartReplica, client: AsyncClient, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(name="batched", import_path="tests.deployments:batched_fn", max_ongoing_requests=8)
    await asyncio.gather(*(client.call("batched", i) for i in range(8)))
    with gateway_process(redis_url, tmp_path) as port:
        samples = await eventually(port, lambda s: value(s, "streamserve_batch_size_sum", deployment="batched") == 8)
        batches = value(samples, "streamserve_batch_size_count", deployment="batched")
        assert batches is not None and 1 <= batches < 8  # several requests per call of the handler


async def test_metrics_off_counts_nothing(
    start_replica: StartReplica, settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    await start_replica(route_prefix="/rec")
    with gateway_process(redis_url, tmp_path, STREAMSERVE_METRICS="0") as port:
        async with httpx.AsyncClient() as http:
            assert (await http.post(f"http://127.0.0.1:{port}/rec", json=1, timeout=5)).status_code == 200
    # The gateway flushes at exit: had it counted, Redis would have the figure now.
    assert not await _metrics_hash(settings, "rec", "requests_total|code=200")


async def _metrics_hash(settings: Settings, deployment: str, field: str) -> bool:
    from streamserve.transport.connections import async_redis

    redis = async_redis(settings.effective_redis_url)
    try:
        return bool(await redis.hexists(settings.keys.metrics(deployment), field))
    finally:
        await redis.aclose()


async def test_the_figures_of_a_deleted_deployment_are_dropped_not_written(
    settings: Settings, aredis: aioredis.Redis
) -> None:
    """A gateway's flush after a delete (the 404s it answered the deleted deployment's callers) made its hash again,
    for good: a new deployment of the name started from the old totals."""
    figures = Figures()
    figures.count("kept", REQUESTS, "200")
    figures.count("deleted", REQUESTS, "404")
    flusher = MetricsFlusher(aredis, settings.keys, figures, exists=lambda name: name == "kept")
    assert await flusher.flush()
    assert await aredis.hgetall(settings.keys.metrics("kept")) == {b"requests_total|code=200": b"1"}
    assert not await aredis.exists(settings.keys.metrics("deleted"))
    assert figures.take() == {}  # not kept for a later flush either


async def test_the_tenants_first_seen_keep_the_last_labels(settings: Settings, aredis: aioredis.Redis) -> None:
    """docs/tenants.md: the first 100 tenants seen get a label of their own. Counted t98, t99, t100, t101 in that
    order with 3 labels left, t101 counts as _other: it was t99, the tenants taken in the order of their names."""
    await aredis.sadd(settings.keys.tenant_labels("ten"), *[f"pre{i}" for i in range(TENANT_LABEL_CAP - 3)])
    figures = Figures()
    for tenant in ("t98", "t99", "t100", "t101"):
        figures.count_field("ten", TENANT_REQUESTS.field(tenant, 200))
    assert await MetricsFlusher(aredis, settings.keys, figures).flush()
    counted = await aredis.hgetall(settings.keys.metrics("ten"))
    labelled = {TENANT_REQUESTS.labels_of(name.decode())[0] for name in counted}  # type: ignore[index]
    assert labelled == {"t98", "t99", "t100", OTHER_TENANTS}


async def test_a_call_that_timed_out_while_it_ran_is_counted_as_its_deadline_not_as_cancelled(
    start_replica: StartReplica, client: AsyncClient, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's timeout cancels its request (so that a queued one leaves the queue); one that runs is still ended
    by its deadline: outcome deadline_exceeded, which dashboards and alerts on timeouts read, not cancelled."""
    monkeypatch.setattr(deployments, "SLOW_ECHO_S", 5.0)
    await start_replica(import_path="tests.deployments:slow_echo", route_prefix="/rec")
    with gateway_process(redis_url, tmp_path) as port:
        for i in range(2):
            with pytest.raises(RequestTimeoutError):
                await client.call("rec", i, timeout=0.3)

        def counted(s: Samples) -> bool:
            return value(s, "streamserve_handled_requests_total", deployment="rec", outcome="deadline_exceeded") == 2

        after = await eventually(port, counted)
        assert value(after, "streamserve_handled_requests_total", deployment="rec", outcome="cancelled") is None
        assert value(after, "streamserve_cancelled_requests_total", deployment="rec", stage="running") == 2
