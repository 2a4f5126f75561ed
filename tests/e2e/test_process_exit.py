"""A streamserve process ends soon after its command or role is done, even when an exit handler would wait for
ever (multiprocessing's, joining a non-daemon child the process started; a pool's, joining a stuck thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from streamserve.runtime.process_exit import EXIT_HANDLERS_S
from tests.harness.paths import ROOT, python_path

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, time
    from streamserve.runtime.process_exit import end_process

    child = multiprocessing.Process(target=time.sleep, args=(600,))  # not a daemon: its exit handler joins it
    child.start()
    print(child.pid, flush=True)
    end_process(7)
    """
)


def test_a_process_ends_though_an_exit_handler_waits_for_a_child_that_runs_on() -> None:
    env = {"PYTHONPATH": python_path(), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    started = time.monotonic()
    child = 0
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            child = int(proc.stdout.readline())
            code = proc.wait(timeout=60)
            took = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
            if child:
                os.kill(child, signal.SIGKILL)  # (this test's own: left to its supervisor, which is the test)
        errors = proc.stderr.read()  # (to its end: the child held it open too)
    assert code == 7
    assert f"exit handlers still running after {EXIT_HANDLERS_S:g}s" in errors
    print(f"ended {took:.1f}s after it started")
