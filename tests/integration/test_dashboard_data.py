"""``/-/dashboard`` and the JSON it polls, against the real redis-server."""

from __future__ import annotations

import re

import httpx
import redis.asyncio as aioredis

from streamserve.metrics.definitions import REQUEST_DURATION, REQUESTS
from streamserve.metrics.figures import Figures
from streamserve.metrics.flusher import MetricsFlusher
from streamserve.metrics.history import SAMPLE_EVERY_MS, MetricsHistory
from streamserve.runtime.settings import Settings
from streamserve.scheduler.store import RedisReplicaStore
from streamserve.wire.messages import AutoscaleRecord
from tests.integration.conftest import StartReplica


async def test_the_page_is_self_contained_and_read_only(http: httpx.AsyncClient) -> None:
    page = await http.get("/-/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text), (
        "the page loads something from elsewhere"
    )
    assert "@import" not in page.text and 'fetch("/-/dashboard/data"' in page.text
    assert (await http.post("/-/dashboard")).status_code == 405


async def test_the_data_has_status_charts_decisions_and_goals(
    start_replica: StartReplica, http: httpx.AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    await start_replica(route_prefix="/rec")
    keys = settings.keys
    figures, history = Figures(), MetricsHistory(aredis, keys)
    flusher = MetricsFlusher(aredis, keys, figures)
    t0 = 1_000_000
    for step, requests in enumerate((0, 20, 50)):  # 20 requests in 5 s, then 50 in the next 5 s
        for _ in range(requests):
            figures.count("rec", REQUESTS, "200")
            figures.observe("rec", REQUEST_DURATION, 0.002)
        await flusher.flush()
        await history.maybe_sample(["rec"], t0 + step * SAMPLE_EVERY_MS)
    store = RedisReplicaStore(aredis, keys)
    await store.save_autoscale("rec", AutoscaleRecord(replicas=1, reason="autoscaling on", updated_ms=1))
    await store.save_autoscale("rec", AutoscaleRecord(replicas=3, reason="ongoing 6.0 on 1 replica(s)", updated_ms=2))

    data = (await http.get("/-/dashboard/data")).json()
    assert data["scheduler_leading"] is False and data["endpoints"] == []
    [rec] = data["deployments"]
    assert rec["name"] == "rec" and rec["running"] == 0 and rec["target"] == 1  # no scheduler records it here
    assert [p["rps"] for p in rec["series"]] == [4.0, 10.0]
    assert all(1.0 < p["p50_ms"] <= 2.5 and 1.0 < p["p99_ms"] <= 2.5 for p in rec["series"])
    assert [(d["from"], d["to"], d["reason"]) for d in rec["decisions"]] == [
        (1, 3, "ongoing 6.0 on 1 replica(s)"),
        (None, 1, "autoscaling on"),
    ]
    assert [g["deployment"] for g in data["goals"]] == ["rec"] and data["goals"][0]["kind"] == "apply"
    assert "redis://" not in (await http.get("/-/dashboard/data")).text
