"""Live reconfiguration without restarts, rolling updates that never drop a request, and a deletion that answers
the requests it leaves."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamserve import Client, NotFoundError
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e


def write_config(
    path: Path,
    name: str,
    *,
    version: str,
    greeting: str,
    max_ongoing: int = 8,
    import_path: str = "examples.echo:Echo",
    replicas: int = 2,
) -> Path:
    path.write_text(
        f"deployments:\n"
        f"  - name: {name}\n"
        f"    import_path: {import_path}\n"
        f"    num_replicas: {replicas}\n"
        f"    version: '{version}'\n"
        f"    max_ongoing_requests: {max_ongoing}\n"
        f"    user_config: {{greeting: {greeting}}}\n"
        f"    graceful_shutdown_timeout_s: 5\n"
    )
    return path


def replica_ids(farm: Farm, name: str) -> set[str]:
    return {r["replica_id"] for r in farm.status()[name]["replicas"]}


STOPWATCH: dict[str, Any] = {"import_path": "tests.deployments:Stopwatch", "replicas": 1}
CONCURRENT = 3
# How long each of the CONCURRENT calls holds its slot (a blocking sleep in a sync handler).
HOLD_S = 1.0


def run_at_once(client: Client, name: str) -> list[dict[str, Any]]:
    """CONCURRENT calls queued together; each result says when the replica ran it."""
    futures = [client.submit(name, {"sleep": HOLD_S}, timeout=30) for _ in range(CONCURRENT)]
    return sorted((f.result(timeout=60) for f in futures), key=lambda ran: float(ran["started"]))


def test_user_config_and_max_ongoing_change_live_without_restarts(farm: Farm, tmp_path: Path) -> None:
    def live(greeting: str, max_ongoing: int) -> str:
        path = tmp_path / "live.yaml"
        return str(write_config(path, "live", version="1", greeting=greeting, max_ongoing=max_ongoing, **STOPWATCH))

    farm.cli("deploy", live("hello", max_ongoing=1), "--wait", "--timeout", "60")
    before = replica_ids(farm, "live")
    with Client(farm.effective_redis_url) as client:
        assert client.call("live", None)["greeting"] == "hello"
        one_slot = run_at_once(client, "live")
        assert len({ran["pid"] for ran in one_slot}) == 1
        # max_ongoing_requests 1: the replica runs them one after another, never two at once.
        for earlier, later in itertools.pairwise(one_slot):
            assert later["started"] >= earlier["ended"], one_slot

        farm.cli("deploy", live("howdy", max_ongoing=CONCURRENT))
        wait_for(lambda: client.call("live", None)["greeting"] == "howdy", 5, "new user_config not visible")
        more_slots = run_at_once(client, "live")
        assert {ran["pid"] for ran in more_slots} == {ran["pid"] for ran in one_slot}  # the same process
        # Raised live to CONCURRENT: all of them run at the same time on that one replica.
        assert max(ran["started"] for ran in more_slots) < min(ran["ended"] for ran in more_slots), more_slots
    assert replica_ids(farm, "live") == before  # reconfigured in place: same replica
    assert farm.status()["live"]["running"] == 1
    farm.cli("delete", "live")


def test_removing_the_user_config_rolls_the_replicas_so_that_none_runs_with_the_old_one(
    farm: Farm, tmp_path: Path
) -> None:
    """A reconfigure() cannot be undone in place: the replica that ran one went on with that user_config while the
    goal said done and a scale-up's new replica ran with none (found by an outside tester)."""
    path = write_config(tmp_path / "gone.yaml", "gone", version="1", greeting="hello", **STOPWATCH)
    farm.cli("deploy", str(path), "--wait", "--timeout", "60")
    before = replica_ids(farm, "gone")
    text = (
        path.read_text()
        .replace("    user_config: {greeting: hello}\n", "")
        .replace("num_replicas: 1", "num_replicas: 2")
    )
    path.write_text(text)
    farm.cli("deploy", str(path), "--wait", "--timeout", "60")
    assert not replica_ids(farm, "gone") & before  # replaced
    with Client(farm.effective_redis_url) as client:
        greetings = {client.call("gone", None)["greeting"] for _ in range(8)}
    assert greetings == {""}, greetings  # every replica as one that starts without a user_config
    farm.cli("delete", "gone")


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


def test_deleting_a_deployment_answers_the_requests_it_never_ran(farm: Farm, tmp_path: Path) -> None:
    """One request runs (20 s, longer than the replica's graceful stop), two wait behind it; the deployment is
    deleted. None of them will ever run: each caller gets 404 NotFoundError once the replica is gone, long before
    its 60 s timeout, over HTTP and from Python."""
    cfg = tmp_path / "gone.yaml"
    cfg.write_text(
        "deployments:\n"
        "  - name: gone\n"
        "    import_path: tests.deployments:Stopwatch\n"
        "    num_replicas: 1\n"
        "    max_ongoing_requests: 1\n"
        "    request_timeout_s: 60\n"
        "    graceful_shutdown_timeout_s: 1\n"
    )
    farm.cli("deploy", str(cfg), "--wait", "--timeout", "60")
    http_answer: list[httpx.Response] = []
    with Client(farm.effective_redis_url) as client:
        running = client.submit("gone", {"sleep": 20})
        wait_for(lambda: farm.status()["gone"]["in_flight"] == 1, 20, "the first request never started")
        queued = client.submit("gone", {"sleep": 20})
        over_http = threading.Thread(target=lambda: http_answer.append(farm.post("/gone", {"sleep": 20})))
        over_http.start()
        try:
            wait_for(lambda: farm.status()["gone"]["queued"] == 2, 20, "the other two were never queued")
            farm.cli("delete", "gone", "--wait", "--timeout", "60")
            for call in (running, queued):
                with pytest.raises(NotFoundError, match="'gone' was deleted before request"):
                    call.result(timeout=30)
        finally:
            over_http.join(timeout=30)
    assert http_answer and http_answer[0].status_code == 404, http_answer
    assert http_answer[0].json()["error"] == "NotFoundError"
