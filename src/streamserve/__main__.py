"""The ``streamserve`` command and ``python -m streamserve``: Ctrl-C answered from the first moment, then the CLI.

The command line's imports take most of a second (more on a loaded host); a Ctrl-C in them raised
KeyboardInterrupt, a traceback, where every later one says ``interrupted`` (cli/interrupt.py). The handler is set
before those imports; a role command gets Python's own back before its process starts (cli/roles.py).
"""

from __future__ import annotations

from typing import NoReturn


def run() -> NoReturn:
    from streamserve.cli.interrupt import on_interrupt, set_sigint

    set_sigint(on_interrupt)
    from streamserve.cli.main import run as run_command

    run_command()


if __name__ == "__main__":
    run()
