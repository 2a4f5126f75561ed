"""end_process (runtime/process_exit.py): a role process that ends at once still runs its exit handlers and flushes
its logs and standard streams, and exits with its code; a role's command line ends through it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness.paths import ROOT

SCRIPT = """
import atexit, logging, sys
from streamserve.runtime.process_exit import end_process

out = sys.argv[1]
atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
handler = logging.StreamHandler(open(out + ".log", "w", buffering=65536))  # flushed only when told to
logging.getLogger().addHandler(handler)
logging.getLogger().warning("last words")
sys.stdout.write("unflushed")
end_process(7)
"""


def test_exit_handlers_logs_and_stdout_are_flushed_and_the_code_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # stdout: a buffered pipe
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "unflushed"
    assert Path(f"{out}.atexit").read_text() == "ran"
    assert Path(f"{out}.log").read_text() == "last words\n"


def test_a_role_that_fails_on_its_config_exits_2_saying_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamserve", "worker", "echo"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "REDIS_URL": "redis://127.0.0.1:1", "STREAMSERVE_HEARTBEAT_INTERVAL_S": "-1"},
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == "error: STREAMSERVE_HEARTBEAT_INTERVAL_S: Input should be greater than 0\n"
