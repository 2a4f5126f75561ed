"""GPUs on one host, declared (these machines have none): each replica sees only devices of its own, and one
that cannot get its GPUs waits in SHOULD_START with the reason in `status`."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.harness.farm import FAST_HEARTBEATS, Farm
from tests.harness.waiting import wait_for

CONFIG = """
deployments:
  - name: gpu
    import_path: tests.deployments:whoami
    num_replicas: 3
    resources: {gpus: 1, cpus: 0.5, memory: 256Mi}
"""


def test_replicas_get_gpus_of_their_own_or_wait_for_them(tmp_path: Path) -> None:
    config = tmp_path / "gpus.yaml"
    config.write_text(CONFIG)
    farm = Farm(config, tmp_path / "farm.log", extra_env={**FAST_HEARTBEATS, "STREAMSERVE_GPUS": "0,1"})
    try:
        farm.start()
        # `up` does not wait out its start timeout for a replica that can never get a GPU: it says why.
        assert b"NOT RUNNING: 3 replica(s) x 1 GPU(s) do not fit the 2 GPU(s) of this host" in farm.log()
        wait_for(lambda: farm.status()["gpu"]["running"] == 2, 60, "two replicas did not start")

        [status] = orjson.loads(farm.cli("status", "--json").stdout)["deployments"]
        running = [r for r in status["replicas"] if r["state"] == "RUNNING"]
        [waiting] = [r for r in status["replicas"] if r["state"] == "SHOULD_START"]
        assert sorted(d for r in running for d in r["gpus"]) == ["0", "1"]
        assert waiting["message"] == "needs 1 GPU, 0 free of 2" and waiting["gpus"] == []
        assert "needs 1 GPU, 0 free of 2" in farm.cli("status").stdout

        # What a handler sees: one device each, never the same one.
        seen = {}
        for _ in range(40):
            body = farm.post("/gpu", "x").json()
            seen[body["pid"]] = body["gpus"]
            if len(seen) == 2:
                break
        assert sorted(seen.values()) == ["0", "1"], seen
        assert {r["pid"] for r in running} == set(seen)
    finally:
        farm.stop()
