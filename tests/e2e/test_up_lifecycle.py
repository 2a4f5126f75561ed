"""`streamserve up` with its embedded Redis: it starts everything and Ctrl-C stops everything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from streamserve.procs import port_is_free
from tests.e2e.farm import ROOT, STREAMSERVE, Farm, pids_with_marker, wait_for

pytestmark = pytest.mark.e2e


def test_up_serves_the_example_and_ctrl_c_leaves_nothing_behind(tmp_path: Path) -> None:
    farm = Farm(ROOT / "examples" / "streamserve.yaml", tmp_path / "up.log")
    farm.start()
    try:
        log = farm.log().decode()
        assert f"gateway   {farm.base_url}" in log
        assert f"redis     redis://127.0.0.1:{farm.redis_port}/0  (embedded)" in log
        resp = farm.post("/echo", {"x": [1, 2, 3]})
        assert resp.status_code == 200 and resp.json()["echo"] == {"x": [1, 2, 3]}
        wait_for(lambda: farm.status()["echo"]["running"] == 2, 20, "echo replicas not running")
        started = pids_with_marker(farm.token)
        # up, scheduler, gateway and 5 replicas; redis-server overwrites its environ with its
        # process title, so it is checked by its port below.
        assert len(started) == 1 + 2 + 5
        assert farm.proc is not None
        farm.proc.send_signal(2)  # Ctrl-C
        assert farm.proc.wait(40) == 0
        assert pids_with_marker(farm.token) == []
        assert port_is_free("127.0.0.1", farm.port)
        assert farm.redis_port is not None
        assert port_is_free("127.0.0.1", farm.redis_port)
    finally:
        farm.stop()


def test_up_with_bad_config_names_the_field_and_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  - name: echo\n    import_path: examples.echo\n")
    result = subprocess.run([STREAMSERVE, "up", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "deployment 'echo' (deployments[0]): import_path" in result.stderr
