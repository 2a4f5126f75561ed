"""Which processes name a handler's request on what its code logs (runtime/logging_setup.HandlerRequestIds)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("role", "names_requests"), [("worker", True), ("gateway", False), ("scheduler", False)])
def test_only_the_processes_that_run_handlers_look_for_their_request(role: str, names_requests: bool) -> None:
    """A replica's records are the ones a handler's code makes; elsewhere (a gateway's access line per request) the
    look would be work for nothing. Run in a process of its own: logging's set-up is the process's."""
    script = (
        "import logging; from streamserve.runtime.logging_setup import HandlerRequestIds, setup_logging; "
        f"setup_logging(role={role!r}); "
        "print(any(isinstance(f, HandlerRequestIds) for f in logging.getLogger().handlers[0].filters))"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert ran.stdout.strip() == str(names_requests), ran.stderr
