"""The `streamserve` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from streamserve import __version__
from streamserve.cli.health import farm_problems
from streamserve.cli.log_reader import DEFAULT_LINES, LogReader, parse_since
from streamserve.client.clients import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.control.goal_records import GOAL_POLL_S, GoalStore
from streamserve.control.security import check_exposure
from streamserve.control.status import DeploymentStatus, StatusReader
from streamserve.runtime.embedded_redis import parse_maxmemory
from streamserve.runtime.settings import Settings, add_gateway_workers_option, add_no_admin_option, add_redis_url_option
from streamserve.transport.connections import RedisRefusals, async_redis
from streamserve.wire.config import EndpointConfig, load_config
from streamserve.wire.errors import BadRequestError, ConfigError, GoalFailedError, RequestTimeoutError, StreamServeError
from streamserve.wire.messages import GoalRecord
from streamserve.wire.states import DeploymentHealth

T = TypeVar("T")

# Commands that run one process of a role; the role package is imported only when chosen.
ROLE_COMMANDS = {
    "gateway": "streamserve.app.main",
    "scheduler": "streamserve.scheduler.main",
    "worker": "streamserve.workers.main",
    "job-worker": "streamserve.workers.job_worker",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve", description="Queue-based model serving over Redis streams.")
    parser.add_argument("--version", action="version", version=f"streamserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_redis_url_option(p)
        return p

    p = add("up", "run Redis (embedded unless --redis-url/REDIS_URL), a scheduler and a gateway on this machine")
    p.add_argument("config", type=Path, help="YAML config file with the deployments")
    p.add_argument("--host", default="127.0.0.1", help="gateway interface (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    p.add_argument("--redis-port", type=int, help="embedded Redis port (default 6379 if free, else any free one)")
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
        "again (default .streamserve in the current directory)",
    )
    p.add_argument("--fresh", action="store_true", help="start the embedded Redis empty (forget its data)")
    add_no_admin_option(p)
    add_gateway_workers_option(p, "--gateway-workers")

    def add_wait(p: argparse.ArgumentParser) -> None:
        p.add_argument("--wait", action="store_true", help="return once the change is done (exit 1 if it fails)")
        p.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits at most (default 300)")

    p = add("deploy", "write the deployments of a config file as the desired state")
    p.add_argument("config", type=Path)
    add_wait(p)

    p = add("status", "show deployments, replicas and queues")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")

    add("health", "exit 0 when a scheduler leads and every deployment is HEALTHY, else 1 with the reasons")

    p = add("logs", "show the recent output of a deployment's replicas (on every host), each line after its replica id")
    p.add_argument("name", help="the deployment")
    p.add_argument("-f", "--follow", action="store_true", help="then print new lines as they come, until Ctrl-C")
    p.add_argument("--replica", metavar="ID", help="only this replica (its id, or the part after #)")
    p.add_argument("--since", metavar="AGE", help="lines of the last AGE, e.g. 30s, 10m, 2h, 1d")
    p.add_argument(
        "-n",
        "--lines",
        type=int,
        default=DEFAULT_LINES,
        help=f"without --since: the newest N (default {DEFAULT_LINES})",
    )

    p = add("scale", "set a deployment's number of replicas")
    p.add_argument("name")
    p.add_argument("replicas", type=int)
    add_wait(p)

    p = add("delete", "remove a deployment (and stop its replicas) or an endpoint")
    p.add_argument("name")
    add_wait(p)

    p = add("traffic", "split an endpoint's traffic between deployments by weight (creates the endpoint if new)")
    p.add_argument("endpoint")
    p.add_argument("weights", nargs="+", metavar="NAME=WEIGHT", help="relative weights, e.g. v1=0.9 v2=0.1")
    p.add_argument(
        "--shadow",
        nargs="*",
        metavar="NAME=FRACTION",
        help="mirror this fraction of requests to NAME (replies dropped); no values clears; absent keeps the shadows",
    )

    p = add("call", "call a deployment or endpoint with a JSON argument and print the JSON result")
    p.add_argument("name")
    p.add_argument("body", nargs="?", default="null", help="JSON (default null)")
    p.add_argument("--timeout", type=float, help="seconds (default: the deployment's request_timeout_s)")
    p.add_argument("--method", default="", help="a method of the deployment's class")

    text = "print Kubernetes YAML for the whole farm: Redis, gateway, scheduler, a Deployment per deployment, KEDA"
    p = sub.add_parser("manifests", help=text, description=text)
    p.add_argument("config", type=Path)
    p.add_argument("--image", help="container image with streamserve and your deployments' code (required)")
    p.add_argument("--namespace", default="streamserve", help="Kubernetes namespace (default streamserve)")
    p.add_argument(
        "--redis-url",
        help="an existing Redis the cluster reaches, without password (that goes in the Secret); "
        "default: a Redis StatefulSet in the namespace",
    )
    from streamserve.manifests.farm_spec import DEFAULT_REDIS_MEMORY  # role commands never build this parser

    p.add_argument(
        "--redis-memory",
        metavar="QUANTITY",
        help="memory of the Redis in the namespace, e.g. 512Mi or 4Gi: its container's request and limit; Redis "
        f"refuses writes before it fills, and its volume grows with it (default {DEFAULT_REDIS_MEMORY})",
    )

    for name, module in ROLE_COMMANDS.items():
        sub.add_parser(name, help=f"run one {name} process (see `streamserve {name} --help`)", add_help=False)
        del module
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ROLE_COMMANDS:
        import importlib

        role_main: Callable[[list[str]], int] = importlib.import_module(ROLE_COMMANDS[argv[0]]).main
        try:
            return role_main(argv[1:])
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    # Ctrl-C exits at once. asyncio.run's own handler only cancels the main task, and a cancellation that
    # lands inside redis-py's pool wait can be swallowed (asyncio.wait_for before 3.12), leaving --wait hanging.
    restore = (
        signal.signal(signal.SIGINT, _interrupt) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        settings = Settings.from_command_line(args)
        return COMMANDS[args.command](args, settings)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StreamServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RedisError as exc:
        print(f"error: Redis: {exc}", file=sys.stderr)
        return 1
    finally:
        if restore is not None:
            signal.signal(signal.SIGINT, restore)


@dataclass(frozen=True)
class Stores:
    """What the commands read and write, on one connection."""

    desired: DesiredState
    goals: GoalStore
    status: StatusReader
    redis: aioredis.Redis


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    """Ctrl-C: exit at once. Nothing a command does needs undoing: each write is one transaction, waits only read."""
    sys.stdout.flush()
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def _with_stores(settings: Settings, fn: Callable[[Stores], Awaitable[T]]) -> T:
    async def run() -> T:
        redis = async_redis(settings.effective_redis_url)
        try:
            keys = settings.keys
            desired = DesiredState(redis, keys, settings.import_allow_list)
            return await fn(Stores(desired, GoalStore(redis, keys), StatusReader(redis, keys), redis))
        finally:
            await redis.aclose()

    return asyncio.run(run())


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from streamserve.cli.up import Farm, UpOptions

    check_exposure(args.host, api_key_set=settings.api_key is not None, admin=settings.admin)
    config = load_config(args.config)
    options = UpOptions(
        config,
        args.config,
        args.host,
        args.port,
        args.redis_port,
        args.redis_maxmemory,
        args.data_dir,
        args.fresh,
        args.gateway_workers,
    )
    return Farm(settings, options).run()


def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    config = load_config(args.config)

    async def deploy(stores: Stores) -> int:
        applied = await stores.desired.apply(config)
        if not applied:
            print("no change")
        for name, goal_id in applied.goals.items():
            print(f"{name}: updated (goal {goal_id})")
        for name in applied.endpoints:
            print(f"{name}: endpoint updated")
        if args.wait:
            deadline = time.monotonic() + args.timeout
            await _wait_for_goals(stores, list(applied.goals.values()), args.timeout)
            unchanged = [d.name for d in config.deployments if d.name not in applied.goals]
            await _wait_until_healthy(stores, unchanged, deadline)
        return 0

    return _with_stores(settings, deploy)


async def _wait_for_goals(stores: Stores, goal_ids: list[str], timeout: float) -> None:
    """Wait for each goal in turn, printing progress when it changes; GoalFailedError says why one failed."""
    deadline = time.monotonic() + timeout
    last_line = ""

    async def show(goal: GoalRecord) -> None:
        nonlocal last_line
        line = await stores.status.progress(goal)
        if line != last_line:
            print(f"  {line}", flush=True)
            last_line = line

    for goal_id in goal_ids:
        goal = await stores.goals.wait(goal_id, max(0.0, deadline - time.monotonic()), on_progress=show)
        print(f"{goal.deployment}: done" + (f", {goal.replicas} replica(s) running" if goal.kind != "delete" else ""))


async def _wait_until_healthy(stores: Stores, names: list[str], deadline: float) -> None:
    """Deployments a write left unchanged have no goal: wait on the scheduler's verdict on them instead.

    So ``deploy --wait`` of an unchanged file still fails for a deployment that cannot run.
    """
    pending = set(names)
    while pending:
        for name in sorted(pending):
            health = await stores.status.health(name)
            if health is not None and health.health is DeploymentHealth.UNHEALTHY:
                raise GoalFailedError(f"{name}: {health.message}")
            if health is not None and health.health is DeploymentHealth.HEALTHY:
                print(f"{name}: unchanged, {health.running} replica(s) running")
                pending.discard(name)
        if pending and time.monotonic() > deadline:
            raise RequestTimeoutError(f"{', '.join(sorted(pending))}: not healthy in time")
        if pending:
            await asyncio.sleep(GOAL_POLL_S)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    async def report(stores: Stores) -> dict[str, Any]:
        return await stores.status.report()

    async def tables(stores: Stores) -> str:
        endpoints = await stores.desired.endpoints()
        text = format_status(await stores.status.status())
        return text + ("\n\n" + format_endpoints([endpoints[n] for n in sorted(endpoints)]) if endpoints else "")

    if args.json:
        sys.stdout.write(orjson.dumps(_with_stores(settings, report), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(_with_stores(settings, tables))
    return 0


def cmd_health(_args: argparse.Namespace, settings: Settings) -> int:
    """For exec probes: one line per problem and exit 1; Redis unreachable is a problem too (main says so)."""
    url = settings.effective_redis_url

    async def check() -> list[str]:
        redis = async_redis(url)
        try:
            with RedisRefusals(url):
                return await farm_problems(redis, settings.keys)
        finally:
            await redis.aclose()

    problems = asyncio.run(check())
    print("\n".join(problems) or "healthy: a scheduler leads and every deployment is HEALTHY")
    return 1 if problems else 0


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _weights(weights: dict[str, float]) -> str:
    return " ".join(f"{name}={weight:g}" for name, weight in sorted(weights.items())) or "-"


def format_endpoints(endpoints: list[EndpointConfig]) -> str:
    rows = [["ENDPOINT", "ROUTE", "TRAFFIC", "SHADOW"]]
    rows += [[e.name, e.route_prefix or "-", _weights(e.traffic), _weights(e.shadow)] for e in endpoints]
    return "\n".join(_table(rows))


def format_status(statuses: list[DeploymentStatus]) -> str:
    if not statuses:
        return "no deployments"
    header = ["DEPLOYMENT", "HEALTH", "TARGET", "RUNNING", "STARTING", "STOPPING", "QUEUED", "IN FLIGHT", "ROUTE"]
    rows = [header] + [
        [
            s.name,
            s.health,
            _target_cell(s),
            str(s.running),
            str(s.starting),
            str(s.stopping),
            str(s.queued),
            str(s.in_flight),
            s.route_prefix or "-",
        ]
        for s in statuses
    ]
    lines = _table(rows)
    replicas = [[r.replica_id, r.state, r.version, r.host or "-", str(r.pid or "-"), str(r.ongoing), r.message]
                for s in statuses for r in s.replicas]  # fmt: skip
    if replicas:
        replica_header = ["REPLICA", "STATE", "VERSION", "HOST", "PID", "ONGOING", "MESSAGE"]
        if not any(row[-1] for row in replicas):  # the column only when some replica says something
            replica_header, replicas = replica_header[:-1], [row[:-1] for row in replicas]
        lines += ["", *_table([replica_header, *replicas]), ""]
    lines += [f"{s.name}: {s.message}" for s in statuses if s.message]
    lines += [
        f"{s.name}: autoscaled to {s.target} ({s.autoscaling.reason})"
        for s in statuses
        if s.autoscaling and s.autoscaling.reason
    ]
    return "\n".join(lines)


def _target_cell(s: DeploymentStatus) -> str:
    """The target count; for an autoscaled deployment also its bounds, e.g. "3 (auto 0-4)"."""
    if s.external_scaler_enabled:
        return f"{s.target} (external)"
    if s.autoscaling is None:
        return str(s.target)
    return f"{s.target} (auto {s.autoscaling.min_replicas}-{s.autoscaling.max_replicas})"


def cmd_logs(args: argparse.Namespace, settings: Settings) -> int:
    """Recent lines (the stream keeps ~10,000 per deployment), then with -f the new ones as they come."""
    try:
        since_s = None if args.since is None else parse_since(args.since)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.lines < 1:
        raise ConfigError("--lines must be at least 1")

    async def show(stores: Stores) -> int:
        await stores.desired.get(args.name)  # NotFoundError (exit 1) for an unknown deployment
        reader = LogReader(stores.redis, settings.keys.logs(args.name))
        after = await reader.latest_id()
        if since_s is not None:
            lines = await reader.since(int((time.time() - since_s) * 1000), args.replica)
        else:
            lines = await reader.last(args.lines, args.replica)
        for line in lines:
            print(line.format())
        sys.stdout.flush()
        if args.follow:
            async for line in reader.follow(after, args.replica):
                print(line.format(), flush=True)
        return 0

    return _with_stores(settings, show)


def cmd_scale(args: argparse.Namespace, settings: Settings) -> int:
    if args.replicas < 0:
        raise ConfigError(f"replicas must be >= 0, got {args.replicas}")

    async def scale(stores: Stores) -> None:
        goal_id = await stores.desired.scale(args.name, args.replicas)
        print(f"{args.name}: {args.replicas} replica(s)" + (f" (goal {goal_id})" if goal_id else " (no change)"))
        if goal_id and args.wait:
            await _wait_for_goals(stores, [goal_id], args.timeout)

    _with_stores(settings, scale)
    return 0


def cmd_traffic(args: argparse.Namespace, settings: Settings) -> int:
    traffic = _parse_pairs(args.weights, "weight")
    shadow = None if args.shadow is None else _parse_pairs(args.shadow, "shadow fraction")

    async def set_traffic(stores: Stores) -> EndpointConfig:
        return await stores.desired.set_traffic(args.endpoint, traffic, shadow)

    endpoint = _with_stores(settings, set_traffic)
    print(format_endpoints([endpoint]))
    return 0


def _parse_pairs(items: list[str], what: str) -> dict[str, float]:
    """``["a=0.9", "b=0.1"]`` -> ``{"a": 0.9, "b": 0.1}``; ConfigError names the item that is wrong."""
    pairs: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not (name and sep):
                raise ValueError(item)
            weight = float(value)
        except ValueError:
            raise ConfigError(f"{item!r} is not NAME={what}, e.g. classify_v1=0.5") from None
        if name in pairs:
            raise ConfigError(f"{name!r} is given twice")
        pairs[name] = weight
    return pairs


def cmd_delete(args: argparse.Namespace, settings: Settings) -> int:
    async def delete(stores: Stores) -> None:
        if args.name in await stores.desired.endpoints():
            await stores.desired.delete_endpoint(args.name)
            print(f"{args.name}: endpoint deleted")
            return
        goal_id = await stores.desired.delete(args.name)
        print(f"{args.name}: deleting (goal {goal_id})")
        if args.wait:
            await _wait_for_goals(stores, [goal_id], args.timeout)

    _with_stores(settings, delete)
    return 0


def cmd_manifests(args: argparse.Namespace, settings: Settings) -> int:
    """Only --redis-url names the farm's Redis: $REDIS_URL is this machine's, not the cluster's."""
    from streamserve.manifests import FarmSpec, notes, render

    spec = FarmSpec.from_file(
        args.config,
        image=args.image,
        namespace=args.namespace,
        redis_url=args.redis_url,
        keys=settings.keys,
        import_allow=settings.import_allow,
        redis_memory=args.redis_memory,
    )
    for note in notes(spec):
        print(f"note: {note}", file=sys.stderr)
    sys.stdout.write(render(spec))
    return 0


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    try:
        body = orjson.loads(args.body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"body is not valid JSON: {exc}") from None

    async def call() -> Any:
        async with AsyncClient(settings=settings) as client:
            return await client.call(args.name, body, timeout=args.timeout, method=args.method)

    result = asyncio.run(call())
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


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
