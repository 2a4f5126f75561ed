"""The ``streamserve`` argument parser: every subcommand and its options.

One step adds one command; ``build_parser`` runs them in the order ``streamserve --help`` lists the commands.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from streamserve import __version__
from streamserve.cli.log_reader import DEFAULT_LINES
from streamserve.cli.roles import ROLE_COMMANDS
from streamserve.runtime.embedded_redis import parse_maxmemory
from streamserve.runtime.settings import (
    add_gateway_workers_option,
    add_no_admin_option,
    add_redis_url_option,
    checked_argument,
    port_number,
)
from streamserve.wire.config import MAX_TIMEOUT_S, check_name
from streamserve.wire.models import check_model_id
from streamserve.wire.tenants import check_tenant

if TYPE_CHECKING:  # argparse's class is generic for type checkers only
    from typing import TypeAlias

    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve", description="Queue-based model serving over Redis streams.")
    parser.add_argument("--version", action="version", version=f"streamserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in (
        _add_up,
        _add_deploy,
        _add_status,
        _add_health,
        _add_logs,
        _add_scale,
        _add_delete,
        _add_traffic,
        _add_call,
        _add_manifests,
        _add_roles,
    ):
        add_command(sub)
    return parser


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; an argument no command takes is a usage error of that command (with its usage line, not
    the top level's, which argparse gives for anything a subcommand leaves over)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        [sub] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        command: argparse.ArgumentParser = sub.choices.get(args.command, parser)
        command.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _command(sub: Subcommands, name: str, help_text: str) -> argparse.ArgumentParser:
    """A command that works on a farm's Redis, so takes --redis-url, and --data-dir to find the farm `up` runs."""
    command = sub.add_parser(name, help=help_text, description=help_text)
    add_redis_url_option(command)
    if name != "up":
        command.add_argument(
            "--data-dir",
            type=Path,
            help="the data directory of the `streamserve up` to work on, when neither --redis-url nor REDIS_URL is "
            "given (default .streamserve in the current directory, if `up` runs from there)",
        )
    return command


def _add_wait_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--wait", action="store_true", help="return once the change is done (exit 1 if it fails)")
    command.add_argument(
        "--timeout", type=_wait_timeout, default=300.0, help="seconds --wait waits at most (default 300)"
    )


def _add_up(sub: Subcommands) -> None:
    text = "run Redis (embedded unless --redis-url/REDIS_URL), a scheduler and a gateway on this machine"
    p = _command(sub, "up", text)
    p.add_argument("config", type=Path, help="YAML config file with the deployments")
    p.add_argument("--host", default="127.0.0.1", help="gateway interface (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="gateway port (default 8000)")
    p.add_argument(
        "--redis-port", type=port_number, help="embedded Redis port (default 6379 if free, else any free one)"
    )
    p.add_argument(
        "--redis-maxmemory",
        type=parse_maxmemory,
        help="embedded Redis's memory limit, e.g. 512mb or 2gb (default a quarter of this machine's memory); "
        "past it writes are refused (503), nothing queued is evicted",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="where the embedded Redis keeps its data, so a restart finds queued requests, jobs and deployments "
        "again, and where the admin token (api_key) and the farm's address (farm.json) are written for the "
        "commands run beside it (default .streamserve in the current directory)",
    )
    p.add_argument("--fresh", action="store_true", help="start the embedded Redis empty (forget its data)")
    add_no_admin_option(p)
    add_gateway_workers_option(p, "--gateway-workers")


def _add_deploy(sub: Subcommands) -> None:
    p = _command(sub, "deploy", "write the deployments of a config file as the desired state")
    p.add_argument("config", type=Path)
    _add_wait_options(p)


def _add_status(sub: Subcommands) -> None:
    p = _command(sub, "status", "show deployments, replicas and queues")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _add_health(sub: Subcommands) -> None:
    _command(sub, "health", "exit 0 when a scheduler leads and every deployment is HEALTHY, else 1 with the reasons")


def _add_logs(sub: Subcommands) -> None:
    text = "show the recent output of a deployment's replicas (on every host), each line after its replica id"
    p = _command(sub, "logs", text)
    p.add_argument("name", type=checked_argument(check_name), help="the deployment")
    p.add_argument("-f", "--follow", action="store_true", help="then print new lines as they come, until Ctrl-C")
    p.add_argument("--replica", metavar="ID", help="only this replica (its id, or the part after #)")
    p.add_argument("--since", metavar="AGE", help="lines of the last AGE, e.g. 30s, 10m, 2h, 1d")
    p.add_argument(
        "--raw",
        action="store_true",
        help="print each line as the replica printed it: control characters (escape sequences, carriage returns) "
        "are not escaped, so they act on this terminal",
    )
    p.add_argument(
        "-n",
        "--lines",
        type=int,
        help=f"the newest N lines (default {DEFAULT_LINES}; with --since, the newest N of that AGE, default all)",
    )


def _add_scale(sub: Subcommands) -> None:
    p = _command(sub, "scale", "set a deployment's number of replicas")
    p.add_argument("name", type=checked_argument(check_name))
    p.add_argument("replicas", type=int)
    _add_wait_options(p)


def _add_delete(sub: Subcommands) -> None:
    p = _command(sub, "delete", "remove a deployment (and stop its replicas) or an endpoint")
    p.add_argument("name", type=checked_argument(check_name))
    p.add_argument(
        "--drain",
        action="store_true",
        help="first wait (up to --timeout) until the deployment holds no request, queued or running: deleted at once,"
        " the requests it still held are answered 404",
    )
    _add_wait_options(p)


def _add_traffic(sub: Subcommands) -> None:
    text = "split an endpoint's traffic between deployments by weight (creates the endpoint if new)"
    p = _command(sub, "traffic", text)
    p.add_argument("endpoint", type=checked_argument(check_name))
    p.add_argument("weights", nargs="+", metavar="NAME=WEIGHT", help="relative weights, e.g. v1=0.9 v2=0.1")
    p.add_argument(
        "--shadow",
        nargs="*",
        metavar="NAME=FRACTION",
        help="mirror this fraction of requests to NAME (replies dropped); no values clears; absent keeps the shadows",
    )


def _wait_timeout(given: str) -> float:
    """--timeout of --wait: seconds, above 0 (a negative one applied the change, then failed the wait at once)."""
    try:
        seconds = float(given)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{given!r} is not a number of seconds") from None
    if not 0 < seconds < math.inf:  # (false for NaN too)
        raise argparse.ArgumentTypeError(f"a timeout is a number of seconds above 0, got {given}")
    return seconds


def _call_timeout(given: str) -> float:
    """--timeout of `call`: seconds, above 0 and at most a week (as the client takes them)."""
    try:
        seconds = float(given)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{given!r} is not a number of seconds") from None
    if not 0 < seconds <= MAX_TIMEOUT_S:  # (false for NaN too)
        raise argparse.ArgumentTypeError(f"a timeout is above 0 and at most {MAX_TIMEOUT_S:g} seconds, got {given}")
    return seconds


def _priority_name(given: str) -> str:
    """A priority level as written in any case and spacing, as over HTTP and from Python."""
    return given.strip().lower()


def _add_call(sub: Subcommands) -> None:
    p = _command(
        sub, "call", "call a deployment or endpoint with a JSON argument and print the JSON result (or each chunk)"
    )
    p.add_argument("name", type=checked_argument(check_name))
    p.add_argument("body", nargs="?", default="null", help="JSON (default null)")
    p.add_argument("--timeout", type=_call_timeout, help="seconds (default: the deployment's request_timeout_s)")
    p.add_argument("--method", default="", help="a method of the deployment's class")
    p.add_argument(
        "--priority",
        type=_priority_name,
        choices=("high", "normal", "low"),
        default="normal",
        help="its priority level (default normal)",
    )
    p.add_argument(
        "--tenant", type=checked_argument(check_tenant), help="whom it is for (default: the tenant 'default')"
    )
    p.add_argument(
        "--model-id",
        type=checked_argument(check_model_id),
        help="the model it runs with, for a deployment that multiplexes models",
    )


def _add_manifests(sub: Subcommands) -> None:
    """Its --redis-url (no $REDIS_URL in its help) names the Redis the cluster reaches, not this machine's."""
    from streamserve.manifests.farm_spec import DEFAULT_REDIS_MEMORY  # role commands never build this parser

    text = "print Kubernetes YAML for the whole farm: Redis, gateway, scheduler, a Deployment per deployment, KEDA"
    p = sub.add_parser("manifests", help=text, description=text)
    p.add_argument("config", type=Path)
    p.add_argument("--image", required=True, help="container image with streamserve and your deployments' code")
    p.add_argument("--namespace", default="streamserve", help="Kubernetes namespace (default streamserve)")
    p.add_argument(
        "--redis-url",
        help="an existing Redis the cluster reaches, without password (that goes in the Secret); "
        "default: a Redis StatefulSet in the namespace",
    )
    p.add_argument(
        "--redis-memory",
        metavar="QUANTITY",
        help="memory of the Redis in the namespace, e.g. 512Mi or 4Gi: its container's request and limit; Redis "
        f"refuses writes before it fills, and its volume grows with it (default {DEFAULT_REDIS_MEMORY})",
    )


def _add_roles(sub: Subcommands) -> None:
    """Listed for --help only: main() hands a role command's arguments to the role before this parser runs."""
    for name in ROLE_COMMANDS:
        sub.add_parser(name, help=f"run one {name} process (see `streamserve {name} --help`)", add_help=False)
