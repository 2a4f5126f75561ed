"""Endpoints end to end: HTTP traffic split by weight, shadow copies, live traffic changes, refused deletes."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest

from streamserve import Client
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

# Enough that a wrong weight fails: the bounds below are about four standard deviations of a fair sample either way.
REQUESTS = 600


def write_config(path: Path, tally: Path) -> Path:
    replica = "    route_prefix: null\n    graceful_shutdown_timeout_s: 5\n"
    path.write_text(
        "deployments:\n"
        f"  - name: classify_v1\n    import_path: examples.echo:Echo\n{replica}"
        f"  - name: classify_v2\n    import_path: examples.echo:Echo\n{replica}"
        f"  - name: classify_v3\n    import_path: tests.deployments:Tally\n"
        f"    init_kwargs: {{path: '{tally}'}}\n{replica}"
        "endpoints:\n"
        "  - name: classify\n"
        "    traffic: {classify_v1: 0.9, classify_v2: 0.1}\n"
        "    shadow: {classify_v3: 0.05}\n"
    )
    return path


async def post_many(url: str, count: int, concurrency: int = 32) -> list[httpx.Response]:
    """``count`` POSTs, at most ``concurrency`` at a time; every response is returned."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as http:

        async def post(i: int) -> httpx.Response:
            async with gate:
                return await http.post(url, json={"i": i})

        return list(await asyncio.gather(*(post(i) for i in range(count))))


def served_by(farm: Farm, count: int) -> Counter[str]:
    responses = asyncio.run(post_many(f"{farm.base_url}/classify", count))
    assert [r.status_code for r in responses] == [200] * count
    return Counter(r.headers["x-deployment"] for r in responses)


def test_endpoint_splits_mirrors_and_follows_traffic_changes(farm: Farm, tmp_path: Path) -> None:
    tally = tmp_path / "shadow.tally"
    tally.touch()
    deployed = farm.cli("deploy", str(write_config(tmp_path / "classify.yaml", tally)), "--wait", "--timeout", "90")
    assert "classify: endpoint created" in deployed.stdout
    wait_for(lambda: httpx.get(f"{farm.base_url}/-/routes").json().get("/classify") == "classify", 10, "no route")

    split = served_by(farm, REQUESTS)
    assert set(split) == {"classify_v1", "classify_v2"}  # the shadow never answers a caller
    assert 0.05 < split["classify_v2"] / REQUESTS < 0.15  # 10% of 600 is 60, give or take 7

    def shadow_calls() -> int:
        return len(tally.read_text().splitlines())

    def shadow_idle() -> bool:
        v3 = farm.status()["classify_v3"]
        return shadow_calls() >= 9 and v3["queued"] == 0 and v3["in_flight"] == 0

    wait_for(shadow_idle, 20, "the shadow deployment did not get its copies")
    assert 9 <= shadow_calls() <= 52  # 5% of 600 is 30, give or take 5.3

    with Client(farm.effective_redis_url) as client:
        assert client.call("classify", {"x": 1}, timeout=10)["echo"] == {"x": 1}

    refused = farm.cli("delete", "classify_v1", check=False)
    assert refused.returncode == 1
    assert "endpoint 'classify' still sends traffic to it" in refused.stderr

    changed = farm.cli("traffic", "classify", "classify_v2=1", "--shadow").stdout
    assert changed.splitlines()[1].split() == ["classify", "/classify", "classify_v2=1", "-"]
    wait_for(lambda: set(served_by(farm, 20)) == {"classify_v2"}, 10, "the gateway did not follow the change")
    table = farm.cli("status").stdout
    assert "ENDPOINT" in table and "classify_v2=1" in table

    farm.cli("delete", "classify")
    for name in ("classify_v1", "classify_v2", "classify_v3"):
        farm.cli("delete", name)
    wait_for(lambda: not any(n.startswith("classify") for n in farm.status()), 30, "deployments not deleted")
