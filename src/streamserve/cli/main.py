"""The ``streamserve`` command line's entry point: pick the command, run it, turn its error into an exit code.

Exit codes: 2 for a usage or config error, 1 for any other error (streamserve's or Redis's), 130 for Ctrl-C,
141 when the reader of its output went away (`streamserve status | head`, as a shell's SIGPIPE), else the command's
own.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from redis.exceptions import ConnectionError, RedisError

from streamserve.cli.calls import cmd_call
from streamserve.cli.farm_lookup import beside_running_farm, no_farm_hint
from streamserve.cli.inspection import cmd_health, cmd_logs, cmd_status
from streamserve.cli.interrupt import on_interrupt, set_sigint
from streamserve.cli.kubernetes import cmd_manifests
from streamserve.cli.parser import parse_command_line
from streamserve.cli.roles import ROLE_COMMANDS, run_role
from streamserve.cli.writes import cmd_delete, cmd_deploy, cmd_scale, cmd_traffic
from streamserve.runtime.process_exit import end_process
from streamserve.runtime.processes import hide_passwords_from_ps
from streamserve.runtime.settings import Settings, unknown_settings
from streamserve.transport.connections import RedisRefusals, connection_hint
from streamserve.wire.errors import ConfigError, RedisUnavailableError, StreamServeError
from streamserve.wire.printable import printable, printable_lines


def run() -> NoReturn:
    """The ``streamserve`` command (and ``python -m streamserve``), once streamserve/__main__.py has set its Ctrl-C
    handler: main's exit code, the process ended as soon as the command is done (runtime/process_exit.py). An
    exception main does not turn into a code takes Python's own way out, with its traceback."""
    end_process(main())


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line (not a caller's list): keep passwords out of `ps`
        hide_passwords_from_ps(sys.argv[1:])
        argv = sys.argv[1:]
    if argv and argv[0] in ROLE_COMMANDS:
        return run_role(argv[0], argv[1:])
    args = parse_command_line(argv)
    # Ctrl-C exits at once. asyncio.run's own handler only cancels the main task, and a cancellation that
    # lands inside redis-py's pool wait can be swallowed (asyncio.wait_for before 3.12), leaving --wait hanging.
    restore = set_sigint(on_interrupt)
    settings: Settings | None = None
    for line in unknown_settings(os.environ):
        print(f"warning: {line}", file=sys.stderr)
    try:
        settings = beside_running_farm(args, Settings.from_command_line(args))
        settings.give_cluster_nodes()
        return COMMANDS[args.command](args, settings)
    except ConfigError as exc:  # (its lines are ours: a config's problems, one a line; a value in one is escaped)
        print(f"error: {printable_lines(str(exc))}", file=sys.stderr)
        return 2
    except RedisUnavailableError as exc:  # (from the client and the probes: `call`, `health`)
        print(f"error: {exc}{no_farm_hint(args, settings) if settings is not None else ''}", file=sys.stderr)
        return 1
    except StreamServeError as exc:  # a handler's own message among them: on one line, nothing that drives a terminal
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except RedisError as exc:
        if settings is None:
            print(f"error: Redis: {exc}", file=sys.stderr)
            return 1
        url = settings.effective_redis_url
        # In the client's words, naming the URL ("error: Redis: invalid username-password pair" named none).
        meant = RedisRefusals(url).meaning(exc)
        hint = (
            no_farm_hint(args, settings) if isinstance(exc, ConnectionError) and not connection_hint(url, exc) else ""
        )
        print(f"error: {printable(str(meant)) if meant is not None else f'Redis: {exc}'}{hint}", file=sys.stderr)
        return 2 if isinstance(meant, ConfigError) else 1  # (a URL naming a database it has not, say: as `call`)
    except BrokenPipeError:  # the reader of its output is gone: nothing more to say, to it or about it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (what is still buffered goes nowhere)
        return 128 + signal.SIGPIPE
    finally:
        if restore is not None:
            set_sigint(restore)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    """``up`` lives in cli/up.py, imported only when it runs: what it needs (httpx...) would slow every command."""
    from streamserve.cli.up import run_up

    return run_up(args, settings)


COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "up": cmd_up,
    "deploy": cmd_deploy,
    "status": cmd_status,
    "health": cmd_health,
    "logs": cmd_logs,
    "scale": cmd_scale,
    "delete": cmd_delete,
    "traffic": cmd_traffic,
    "call": cmd_call,
    "manifests": cmd_manifests,
}
