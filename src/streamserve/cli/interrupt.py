"""What Ctrl-C does to a command: one line, ``interrupted``, and exit 130, from wherever the command was.

Light on purpose (nothing of ours, nothing third-party): the console entry point (streamserve/__main__.py) sets it
as the SIGINT handler before it imports the rest of the command line, which takes most of a second.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

SigintHandler = Callable[[int, FrameType | None], Any] | int | None


def exit_interrupted() -> NoReturn:
    """Ctrl-C: exit at once (every command but a call's first Ctrl-C: cli/calls.py), saying so."""
    sys.stdout.flush()
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def on_interrupt(_signum: int, _frame: FrameType | None) -> None:
    """The SIGINT handler of a command. Nothing a command does needs undoing: each write is one transaction, waits
    only read."""
    exit_interrupted()


def set_sigint(handler: SigintHandler) -> SigintHandler:
    """Make ``handler`` the SIGINT handler and return the one it replaces; on a thread other than the main one
    (a test calling a command in-process), where Python refuses to set it, nothing is done and None is returned."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)
