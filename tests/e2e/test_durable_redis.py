"""The embedded Redis keeps its data (append-only file in --data-dir) and `up` keeps it running: Ctrl-C and `up`
again, or a redis-server killed with -9, lose no queued request, deployment or endpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import orjson
import pytest

from streamserve.client import Client
from tests.harness.farm import Farm, farm_on
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - name: lines
    import_path: tests.deployments:append_line
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 1
"""
EXTRA = """
deployments:
  - {name: extra, import_path: 'examples.functions:noop', num_replicas: 1}
"""


@pytest.fixture
def farm(tmp_path: Path) -> Farm:
    return farm_on(CONFIG, tmp_path)


def lines(path: Path) -> list[str]:
    return sorted(path.read_text().split()) if path.exists() else []


def test_ctrl_c_and_up_again_brings_back_queued_work_and_what_was_written(farm: Farm, tmp_path: Path) -> None:
    out, hold = tmp_path / "out.txt", tmp_path / "hold"
    farm.start()
    try:
        assert f"data      {farm.data_dir}/" in farm.log().decode()
        extra = tmp_path / "extra.yaml"
        extra.write_text(EXTRA)
        farm.cli("deploy", str(extra), "--wait")
        farm.cli("traffic", "ep", "lines=1")
        with Client(farm.effective_redis_url) as client:
            # The one replica holds the first; the rest queue behind it.
            client.send("lines", {"path": str(out), "line": "held", "wait_for": str(hold)})
            for i in range(3):
                client.send("lines", {"path": str(out), "line": f"sent-{i}"})
        wait_for(lambda: farm.status()["lines"]["queued"] >= 3, 20, "the requests did not queue")
        assert farm.stop() == 0  # Ctrl-C: the held request is cut off at its 1 s drain
        assert lines(out) == []

        farm.start()  # same data directory and ports
        hold.touch()
        wait_for(lambda: lines(out) == ["held", "sent-0", "sent-1", "sent-2"], 60, f"served: {lines(out)}")
        report = orjson.loads(farm.cli("status", "--json").stdout)
        assert {d["name"] for d in report["deployments"]} == {"lines", "extra"}
        assert [e["name"] for e in report["endpoints"]] == ["ep"]
    finally:
        farm.stop()


def test_fresh_starts_empty(farm: Farm, tmp_path: Path) -> None:
    farm.start()
    try:
        farm.cli("traffic", "ep", "lines=1")
    finally:
        farm.stop()
    farm.extra_args = ["--fresh"]
    farm.start()
    try:
        assert orjson.loads(farm.cli("status", "--json").stdout)["endpoints"] == []
    finally:
        farm.stop()


def test_a_killed_redis_server_is_restarted_on_its_data(farm: Farm, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    farm.start()
    try:
        farm.cli("traffic", "ep", "lines=1")
        [redis_pid] = farm.role_pids()["redis-server"]
        os.kill(redis_pid, signal.SIGKILL)
        wait_for(lambda: b"the embedded redis-server died; restarting it" in farm.log(), 20, "up did not notice")

        def serves() -> bool:
            try:
                return farm.post("/lines", {"path": str(out), "line": "after"}).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(serves, 30, "the farm did not serve again after Redis came back")
        assert httpx.get(farm.base_url + "/-/healthz", timeout=5).status_code == 200
        assert [e["name"] for e in orjson.loads(farm.cli("status", "--json").stdout)["endpoints"]] == ["ep"]
    finally:
        farm.stop()
