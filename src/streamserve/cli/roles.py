"""The role commands (``gateway``, ``scheduler``, ``worker``, ``job-worker``): each runs one process of its role.

A role's package is imported only when its command is chosen, by module name: the CLI never imports a role.
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Callable

from streamserve.cli.interrupt import set_sigint
from streamserve.runtime.propagators import drop_missing_propagators
from streamserve.wire.errors import ConfigError

# Command -> the module whose main(argv) runs that role's process.
ROLE_COMMANDS = {
    "gateway": "streamserve.app.main",
    "scheduler": "streamserve.scheduler.main",
    "worker": "streamserve.workers.main",
    "job-worker": "streamserve.workers.job_worker",
}


def run_role(command: str, argv: list[str]) -> int:
    """Run the role's own ``main`` on the rest of the command line (it parses its own options)."""
    if dropped := drop_missing_propagators():  # before the role's imports: they would raise for it
        print(f"warning: {dropped}", file=sys.stderr)
    role_main: Callable[[list[str]], int] = importlib.import_module(ROLE_COMMANDS[command]).main
    # The role answers signals its own way, from Python's (the CLI's Ctrl-C covered its imports: __main__.py).
    set_sigint(signal.default_int_handler)
    try:
        return role_main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
