"""Live reconfiguration without restarts, and rolling updates that never drop a request."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from streamserve import Client
from tests.e2e.farm import Farm, wait_for

pytestmark = pytest.mark.e2e


def write_config(path: Path, name: str, *, version: str, greeting: str, max_ongoing: int = 8) -> Path:
    path.write_text(
        f"deployments:\n"
        f"  - name: {name}\n"
        f"    import_path: examples.echo:Echo\n"
        f"    num_replicas: 2\n"
        f"    version: '{version}'\n"
        f"    max_ongoing_requests: {max_ongoing}\n"
        f"    user_config: {{greeting: {greeting}}}\n"
        f"    graceful_shutdown_timeout_s: 5\n"
    )
    return path


def replica_ids(farm: Farm, name: str) -> set[str]:
    return {r["replica_id"] for r in farm.status()[name]["replicas"]}


def test_user_config_and_max_ongoing_change_live_without_restarts(farm: Farm, tmp_path: Path) -> None:
    cfg = tmp_path / "live.yaml"
    farm.cli("deploy", str(write_config(cfg, "live", version="1", greeting="hello")), "--wait", "--timeout", "60")
    before = replica_ids(farm, "live")
    with Client(farm.effective_redis_url) as client:
        assert client.call("live", 1)["greeting"] == "hello"
        farm.cli("deploy", str(write_config(cfg, "live", version="1", greeting="howdy", max_ongoing=3)))

        def both_replicas_say_howdy() -> bool:
            replies = [client.call("live", i) for i in range(8)]
            return all(r["greeting"] == "howdy" for r in replies)

        wait_for(both_replicas_say_howdy, 5, "new user_config not visible in replies")
    assert replica_ids(farm, "live") == before  # reconfigured in place: same replicas
    assert farm.status()["live"]["running"] == 2
    farm.cli("delete", "live")


def test_version_change_rolls_replicas_while_traffic_succeeds(farm: Farm, tmp_path: Path) -> None:
    cfg = tmp_path / "roll.yaml"
    farm.cli("deploy", str(write_config(cfg, "roll", version="1", greeting="v1")), "--wait", "--timeout", "60")
    old_ids = replica_ids(farm, "roll")
    results: list[str] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def steady_traffic(client: Client) -> None:
        while not stop.is_set() and len(results) < 20_000:
            try:
                results.append(client.call("roll", "ping", timeout=10)["greeting"])
            except Exception as exc:
                failures.append(exc)

    with Client(farm.effective_redis_url) as client:
        senders = [threading.Thread(target=steady_traffic, args=(client,)) for _ in range(4)]
        for t in senders:
            t.start()
        try:
            wait_for(lambda: len(results) > 50, 10, "traffic did not start")
            rolled = farm.cli("deploy", str(write_config(cfg, "roll", version="2", greeting="v2")), "--wait")
            assert "roll: done, 2 replica(s) running" in rolled.stdout
            wait_for(lambda: results[-1] == "v2", 10, "traffic not served by the new version")
        finally:
            stop.set()
            for t in senders:
                t.join(timeout=30)
    assert failures == []
    assert "v1" in results and "v2" in results
    new_ids = replica_ids(farm, "roll")
    assert new_ids.isdisjoint(old_ids) and len(new_ids) == 2
    farm.cli("delete", "roll")
