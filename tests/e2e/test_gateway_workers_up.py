"""`streamserve up --gateway-workers 2`: two gateway processes on the farm's port; Ctrl-C stops them all."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.harness.farm import descendants, farm_on, pids_with_marker
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: echo
    import_path: examples.echo:Echo
    route_prefix: /echo
    graceful_shutdown_timeout_s: 2
"""


def test_up_runs_gateway_workers_and_stops_them(tmp_path: Path) -> None:
    farm = farm_on(CONFIG, tmp_path)
    farm.extra_args = ["--gateway-workers", "2"]
    farm.start()
    try:
        assert f"gateway   {farm.base_url}  (2 processes)" in farm.log().decode()
        wait_for(lambda: farm.status()["echo"]["running"] == 1, 60, "echo not up")
        assert farm.proc is not None
        up = farm.proc.pid

        def workers() -> list[int]:
            return [pid for pid, argv in descendants(up).items() if b"spawn_main" in argv]

        wait_for(lambda: len(workers()) == 2, 30, "two gateway workers did not start")
        for i in range(40):  # a new connection each: both workers take some
            assert httpx.post(f"{farm.base_url}/echo", json={"i": i}, timeout=10).status_code == 200
    finally:
        farm.stop()
    assert pids_with_marker(farm.token) == []
