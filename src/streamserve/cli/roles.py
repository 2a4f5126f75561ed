"""The role commands (``gateway``, ``scheduler``, ``worker``, ``job-worker``): each runs one process of its role.

A role's package is imported only when its command is chosen, by module name: the CLI never imports a role.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import NoReturn

from streamserve.runtime.process_exit import end_process
from streamserve.wire.errors import ConfigError

# Command -> the module whose main(argv) runs that role's process.
ROLE_COMMANDS = {
    "gateway": "streamserve.app.main",
    "scheduler": "streamserve.scheduler.main",
    "worker": "streamserve.workers.main",
    "job-worker": "streamserve.workers.job_worker",
}


def run_role(command: str, argv: list[str]) -> NoReturn:
    """Run the role's own ``main`` on the rest of the command line (it parses its own options), and end the process
    with its exit code (runtime/process_exit.py: a role process ends as soon as its work is done). An exception other
    than a config error takes Python's own way out, with its traceback."""
    role_main: Callable[[list[str]], int] = importlib.import_module(ROLE_COMMANDS[command]).main
    try:
        code = role_main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    end_process(code)
