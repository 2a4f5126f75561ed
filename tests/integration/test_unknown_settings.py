"""A STREAMSERVE_ variable that is no setting is warned about where the user started a process, once: a misspelt
name is otherwise ignored without a word (STREAMSERVE_API_KEYS left the gateway open)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.harness.farm import Processes, marked_env
from tests.harness.paths import STREAMSERVE
from tests.harness.waiting import wait_for

TYPO = "STREAMSERVE_API_KEYS is not a streamserve setting and is ignored (did you mean STREAMSERVE_API_KEY?)"


def test_a_command_names_the_misspelt_variable_and_the_setting_meant(redis_url: str) -> None:
    env = marked_env("unknown-settings", {"STREAMSERVE_API_KEYS": "k", "STREAMSERVE_REDIS_MAXMEMORY": "1gb"})
    result = subprocess.run(
        [STREAMSERVE, "status", "--redis-url", redis_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"warning: {TYPO}"]  # (compose's variable is no surprise)


def test_a_scheduler_warns_once_and_the_processes_it_starts_do_not_repeat_it(redis_url: str, tmp_path: Path) -> None:
    procs = Processes(redis_url, tmp_path, extra_env={"STREAMSERVE_API_KEYS": "k"})
    try:
        procs.spawn("scheduler", "scheduler")  # its 2 job workers write to the same output

        def job_workers_serving() -> bool:
            return procs.log("scheduler").read_text().count("serving queue") >= 2

        wait_for(job_workers_serving, 30, "the scheduler's job workers did not start")
    finally:
        procs.stop_all()
    output = procs.log("scheduler").read_text()
    assert output.count(TYPO) == 1, output
