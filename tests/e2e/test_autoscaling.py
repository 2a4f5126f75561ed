"""Autoscaling end to end: from 0 replicas a request waits for the first one; a burst scales up; idle scales to 0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamserve import Client
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).parent / "autoscale.yaml"
BURST = 8  # concurrent 3 s requests: 8 ongoing at target 1 per replica asks for the max, 3 replicas


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    farm = Farm(CONFIG, tmp_path_factory.mktemp("autoscale") / "up.log").start()
    try:
        yield farm
    finally:
        farm.stop()


def lazy(farm: Farm) -> dict[str, Any]:
    status: dict[str, Any] = farm.status()["lazy"]
    return status


def idle_at_zero(farm: Farm) -> bool:
    s = lazy(farm)
    return bool(s["target"] == s["running"] == s["starting"] == s["stopping"] == 0)


def test_first_request_to_an_idle_deployment_waits_for_a_replica_and_succeeds(farm: Farm) -> None:
    wait_for(lambda: idle_at_zero(farm), 30, "lazy did not start at 0 replicas")
    resp = farm.post("/lazy", {"seconds": 0})  # through the gateway: queued, not refused
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"slept": 0}
    assert b"deployment lazy: autoscale 0 -> 1 (1 request(s) waiting and no replica)" in farm.log()


def test_a_burst_scales_up_and_idle_scales_back_to_zero(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        futures = [client.submit("lazy", {"seconds": 3}, timeout=60) for _ in range(BURST)]
        try:
            wait_for(lambda: lazy(farm)["running"] > 1, 30, "no second replica under load")
        finally:
            results = [f.result(timeout=60) for f in futures]
    assert results == [{"slept": 3}] * BURST
    table = farm.cli("status").stdout
    assert "(auto 0-3)" in table
    wait_for(lambda: idle_at_zero(farm), 40, "lazy did not come back to 0 replicas when idle")
    log = farm.log().decode(errors="replace")
    assert "target 1 each" in log  # decisions are logged with their reason
    assert lazy(farm)["autoscaling"]["reason"].startswith("ongoing 0.0")


def test_redeploy_is_a_no_op_and_deploy_wait_of_a_min_zero_deployment_returns(farm: Farm, tmp_path: Path) -> None:
    assert "no change" in farm.cli("deploy", str(CONFIG), "--wait", "--timeout", "30").stdout
    other = tmp_path / "other.yaml"
    other.write_text(
        "deployments:\n"
        "  - name: idle\n"
        "    import_path: examples.functions:noop\n"
        "    autoscaling_config: {min_replicas: 0, max_replicas: 2}\n"
    )
    done = farm.cli("deploy", str(other), "--wait", "--timeout", "30")
    assert "idle: done, 0 replica(s) running" in done.stdout
    farm.cli("delete", "idle", "--wait", "--timeout", "30")
