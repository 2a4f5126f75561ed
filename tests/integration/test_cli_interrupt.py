"""Ctrl-C on any command, at any moment, says ``interrupted`` and exits 130: no traceback, not even while the command
line is still being imported (most of a second) or is waiting on a Redis that never answers."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.harness.paths import STREAMSERVE


@pytest.fixture
def silent_url() -> Iterator[tuple[socket.socket, str]]:
    """A listening socket that accepts and never answers, and a Redis URL naming it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    try:
        yield listener, f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        listener.close()


def interrupted(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C ``proc``; its stderr once it has ended, asserting the one line and exit 130."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and err.rstrip().endswith("interrupted"), err
    assert proc.returncode == 130
    return err


@pytest.mark.parametrize("command", [("status",), ("scale", "echo", "3", "--wait")])
def test_ctrl_c_while_redis_does_not_answer(silent_url: tuple[socket.socket, str], command: tuple[str, ...]) -> None:
    listener, url = silent_url
    proc = subprocess.Popen([STREAMSERVE, *command, "--redis-url", url], stderr=subprocess.PIPE, text=True)
    connection, _ = listener.accept()  # the command is connecting: it waits for an answer that never comes
    with connection:
        interrupted(proc)


def test_ctrl_c_while_the_command_line_is_imported(silent_url: tuple[socket.socket, str]) -> None:
    """``-X importtime`` writes a line as each module is imported: Ctrl-C once streamserve's wire format is, which
    the command line imports about half way through."""
    command = [sys.executable, "-X", "importtime", STREAMSERVE, "status", "--redis-url", silent_url[1]]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.rstrip().endswith(" streamserve.wire.errors"):
            break
    interrupted(proc)
