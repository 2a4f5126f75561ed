"""Two schedulers: one leads, the other stands by and takes over when the leader is killed mid-goal."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from streamserve import Client
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: add
    import_path: examples.functions:add
    num_replicas: 2
    graceful_shutdown_timeout_s: 5
"""


def test_standby_takes_over_adopts_replicas_and_finishes_the_goal(
    processes: Processes, redis_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "add.yaml"
    config.write_text(CONFIG)
    processes.run("deploy", str(config))
    schedulers = {name: processes.spawn(name, "scheduler") for name in ("first", "second")}

    def replicas() -> dict[str, dict[str, object]]:
        [add] = orjson.loads(processes.run("status", "--json").stdout)["deployments"]
        return {r["replica_id"]: r for r in add["replicas"] if r["state"] == "RUNNING"}

    def leaders() -> list[str]:
        return [name for name in schedulers if b": leading" in processes.log(name).read_bytes()]

    wait_for(lambda: len(replicas()) == 2 and leaders(), 30, "no scheduler brought the replicas up")
    [leader] = leaders()
    [standby] = [name for name in schedulers if name != leader]
    wait_for(lambda: b"standing by while scheduler" in processes.log(standby).read_bytes(), 10, "standby is silent")
    before = {rid: r["pid"] for rid, r in replicas().items()}

    with Client(redis_url) as client:
        goal = client.scale("add", 3)
        assert goal is not None
        schedulers[leader].kill()  # SIGKILL, with the goal still in flight
        wait_for(lambda: standby in leaders(), 15, "the standby did not take over")
        assert client.wait_for_goal(goal, timeout=30).status.value == "DONE"
        after = replicas()
        assert len(after) == 3
        assert {rid: after[rid]["pid"] for rid in before} == before  # adopted: not restarted, no duplicates
        assert client.call("add", {"a": 1, "b": 2}) == {"sum": 3}
    assert schedulers[standby].poll() is None
