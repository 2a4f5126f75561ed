"""The soak, CI-sized: a farm under mixed load while a replica, the scheduler, the gateway and Redis are each
killed once; nothing is lost and no caller that got a correct answer saw its request run twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.paths import ROOT

pytestmark = pytest.mark.e2e


def test_a_short_soak_loses_nothing_and_runs_no_answered_request_twice(tmp_path: Path) -> None:
    out = tmp_path / "soak.md"
    cmd = [sys.executable, "-m", "tests.soak.soak", "--minutes", "1", "--fault-every", "14", "--out", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420, check=False)
    report = out.read_text() if out.exists() else ""
    assert result.returncode == 0, f"{report}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    for fault in ("replica: SIGKILL", "scheduler: SIGKILL", "gateway: SIGKILL", "redis: SIGTERM"):
        assert fault in report, report
    assert "- lost (no answer by the deadline + 10 s, or a job never final): 0" in report
    assert "- run more than once, among correct answers: 0;" in report
