"""The soak, CI-sized: a farm under mixed load while a replica, the scheduler, the gateway and Redis are each
killed once; nothing is lost and no caller that got a correct answer saw its request run twice."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.paths import ROOT

# The soak's own bound (its farm's start, a minute of load and faults, the wind-down) is SOAK_TIMEOUT_S; pytest's is
# longer, so that a soak that overruns is stopped by the test, which lets it stop its farm (on a busy machine `up`
# alone took 50 s to start everything once).
SOAK_TIMEOUT_S = 420
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(SOAK_TIMEOUT_S + 120)]


def test_a_short_soak_loses_nothing_and_runs_no_answered_request_twice(tmp_path: Path) -> None:
    out = tmp_path / "soak.md"
    cmd = [sys.executable, "-m", "tests.soak.soak", "--minutes", "1", "--fault-every", "14", "--out", str(out)]
    soak = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = soak.communicate(timeout=SOAK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stdout, stderr = _interrupt(soak)
        pytest.fail(f"the soak took more than {SOAK_TIMEOUT_S} s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    except BaseException:  # pytest's own timeout, Ctrl-C: the soak's farm must not outlive the test
        _interrupt(soak)
        raise
    report = out.read_text() if out.exists() else ""
    assert soak.returncode == 0, f"{report}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    for fault in ("replica: SIGKILL", "scheduler: SIGKILL", "gateway: SIGKILL", "redis: SIGTERM"):
        assert fault in report, report
    assert "- lost (no answer by the deadline + 10 s, or a job never final): 0" in report
    assert "- run more than once, among correct answers: 0;" in report


def _interrupt(soak: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C the soak, which stops its farm (and all it started) on its way out; kill it if it has not in 90 s."""
    soak.send_signal(signal.SIGINT)
    try:
        return soak.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        soak.kill()
        return soak.communicate()
