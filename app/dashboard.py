"""``GET /-/dashboard``: one self-contained page (no CDN: it works where there is no internet), and
``GET /-/dashboard/data``, the JSON it polls: status, charts of the last minutes, autoscaling decisions, goals."""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson
import redis.asyncio as aioredis
from fastapi import APIRouter, Response

from streamserve.app.errors import json_response
from streamserve.client import AsyncClient
from streamserve.control.status import StatusReader
from streamserve.metrics.history import SAMPLES_KEPT
from streamserve.metrics.series import series
from streamserve.transport.redis_waits import READ_REDIS_WAIT_S, redis_answers_within
from streamserve.wire.keys import Keys
from streamserve.wire.messages import AutoscaleRecord, GoalRecord, now_ms

# Shown per deployment / farm.
DECISIONS_SHOWN = 10
GOALS_SHOWN = 10

PAGE = resources.files("streamserve.app").joinpath("dashboard.html").read_bytes()


def dashboard_router(client: AsyncClient, keys: Keys, redis_url: str) -> APIRouter:
    router = APIRouter(prefix="/-")

    @router.get("/dashboard", include_in_schema=False)
    async def page() -> Response:
        return Response(PAGE, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-store"})

    @router.get("/dashboard/data")
    async def data() -> Response:
        """What the dashboard shows, read-only: deployments (status, charts, autoscaling decisions), goals."""
        async with redis_answers_within(READ_REDIS_WAIT_S, redis_url):
            found = await dashboard_data(client.redis, keys)
        return json_response(found)

    return router


async def dashboard_data(redis: aioredis.Redis, keys: Keys) -> dict[str, Any]:
    report = await StatusReader(redis, keys).report()
    names = [d["name"] for d in report["deployments"]]
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.xrevrange(keys.metrics_history(name), "+", "-", count=SAMPLES_KEPT)
            pipe.xrevrange(keys.autoscale_decisions(name), "+", "-", count=DECISIONS_SHOWN + 1)
        pipe.hgetall(keys.goals())
        pipe.exists(keys.scheduler_lock())
        *per_deployment, goals_raw, leading = await pipe.execute()
    for index, deployment in enumerate(report["deployments"]):
        history, decisions = per_deployment[2 * index], per_deployment[2 * index + 1]
        deployment["series"] = series([orjson.loads(fields[b"s"]) for _id, fields in reversed(history)])
        deployment["decisions"] = _decisions([AutoscaleRecord.decode(f[b"record"]) for _id, f in decisions])
    goals = sorted((GoalRecord.decode(raw) for raw in goals_raw.values()), key=lambda g: -g.updated_ms)
    return {
        "now_ms": now_ms(),
        "scheduler_leading": bool(leading),
        "deployments": report["deployments"],
        "endpoints": report["endpoints"],
        "goals": [g.model_dump(mode="json") for g in goals[:GOALS_SHOWN]],
    }


def _decisions(newest_first: list[AutoscaleRecord]) -> list[dict[str, Any]]:
    """Each decision with the count it came from (that of the one before it, when it is still kept)."""
    shown = []
    for index, record in enumerate(newest_first[:DECISIONS_SHOWN]):
        before = newest_first[index + 1].replicas if index + 1 < len(newest_first) else None
        shown.append({"t": record.updated_ms, "from": before, "to": record.replicas, "reason": record.reason})
    return shown
