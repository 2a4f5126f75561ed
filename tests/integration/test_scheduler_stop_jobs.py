"""`up` tells its scheduler, as it begins to stop, that no job is to start any more (STOP_JOBS_SIGNAL). A Ctrl-C
can come while the scheduler is still starting: the signal must then wait for it, neither end it (the signal's
default action) nor be lost (job workers would take the queued jobs while the gateway drains)."""

from __future__ import annotations

import os

import pytest

from streamserve import Client
from streamserve.runtime.lifeline import STOP_JOBS_SIGNAL, hold_stop_jobs_signal
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig
from tests.harness.farm import Processes
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_stop_jobs_signal_sent_while_the_scheduler_starts_waits_for_it(
    processes: Processes, settings: Settings
) -> None:
    scheduler = processes.spawn("scheduler", "scheduler", preexec_fn=hold_stop_jobs_signal)  # as `up` starts it
    os.kill(scheduler.pid, STOP_JOBS_SIGNAL)  # while Python starts: before the scheduler could take it
    log = processes.log("scheduler")
    wait_for(
        lambda: "the farm is stopping" in log.read_text() or scheduler.poll() is not None,
        30,
        lambda: f"the signal was not taken:\n{log.read_text()[-2000:]}",
    )
    assert scheduler.poll() is None, f"the signal ended the scheduler (exit {scheduler.returncode})"
    with Client(settings.effective_redis_url) as client:
        client.deploy(AppConfig(deployments=[DeploymentConfig(name="noop", import_path="examples.functions:noop")]))
        assert client.call("noop", {"x": 1}, timeout=60) == {"x": 1}  # the scheduler ran its ticks: a replica serves
    assert "job worker started" not in log.read_text()
