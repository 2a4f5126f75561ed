"""The control-plane writes: ``deploy``, ``scale``, ``delete``, ``traffic``; with ``--wait``, until they are done."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from streamserve.cli.stores import Stores, with_stores
from streamserve.cli.tables import format_endpoints
from streamserve.control.desired_state import Applied, DesiredState
from streamserve.control.goal_records import GOAL_POLL_S
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, EndpointConfig, load_config
from streamserve.wire.errors import ConfigError, ConflictError, GoalFailedError, RequestTimeoutError
from streamserve.wire.messages import GoalRecord
from streamserve.wire.printable import printable
from streamserve.wire.states import DeploymentHealth

# Why a goal or a deployment's health waited for in vain was never going to come.
NO_SCHEDULER = "no scheduler leads (none runs, or none reaches Redis)"


async def apply_file(desired: DesiredState, config: AppConfig, path: str | Path) -> Applied:
    """Apply the config read from ``path``; a ConfigError of the farm's whole desired state (an endpoint sending
    to no deployment, say) names the file as one of the file alone does."""
    try:
        return await desired.apply(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    config = load_config(args.config, settings.config_limit_values)

    async def deploy(stores: Stores) -> int:
        there = set(await stores.desired.get_many([d.name for d in config.deployments]))
        endpoints_there = set(await stores.desired.endpoints())
        applied = await apply_file(stores.desired, config, args.config)
        if not applied:
            print("no change")
        for name, goal_id in applied.goals.items():
            print(f"{name}: {'updated' if name in there else 'created'} (goal {goal_id})")
        for name in applied.endpoints:
            print(f"{name}: endpoint {'updated' if name in endpoints_there else 'created'}")
        if args.wait:
            deadline = time.monotonic() + args.timeout
            await _wait_for_goals(stores, list(applied.goals.values()), args.timeout)
            unchanged = [d.name for d in config.deployments if d.name not in applied.goals]
            await _wait_until_healthy(stores, unchanged, deadline)
        return 0

    return with_stores(settings, deploy)


async def _wait_for_goals(stores: Stores, goal_ids: list[str], timeout: float) -> None:
    """Wait for each goal in turn, printing progress when it changes; GoalFailedError says why one failed."""
    deadline = time.monotonic() + timeout
    last_line = ""

    async def show(goal: GoalRecord) -> None:
        nonlocal last_line
        line = await stores.status.progress(goal)
        if line != last_line:
            print(f"  {printable(line)}", flush=True)
            last_line = line

    for goal_id in goal_ids:
        try:
            goal = await stores.goals.wait(goal_id, max(0.0, deadline - time.monotonic()), on_progress=show)
        except RequestTimeoutError as exc:
            if await stores.scheduler_leads():
                raise
            raise RequestTimeoutError(f"{exc}: {NO_SCHEDULER}") from None
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
            unled = "" if await stores.scheduler_leads() else f": {NO_SCHEDULER}"
            raise RequestTimeoutError(f"{', '.join(sorted(pending))}: not healthy in time{unled}")
        if pending:
            await asyncio.sleep(GOAL_POLL_S)


def cmd_scale(args: argparse.Namespace, settings: Settings) -> int:
    if args.replicas < 0:
        raise ConfigError(f"replicas must be >= 0, got {args.replicas}")

    async def scale(stores: Stores) -> None:
        goal_id = await stores.desired.scale(args.name, args.replicas)
        print(f"{args.name}: {args.replicas} replica(s)" + (f" (goal {goal_id})" if goal_id else " (no change)"))
        if goal_id and args.wait:
            await _wait_for_goals(stores, [goal_id], args.timeout)

    with_stores(settings, scale)
    return 0


def cmd_delete(args: argparse.Namespace, settings: Settings) -> int:
    async def delete(stores: Stores) -> None:
        deadline = time.monotonic() + args.timeout
        if args.drain:
            await _drain(stores, args.name, deadline)
        goal_id = await stores.desired.delete_named(args.name)
        if goal_id is None:
            print(f"{args.name}: endpoint deleted")
            return
        print(f"{args.name}: deleting (goal {goal_id})")
        if args.wait:
            await _wait_for_goals(stores, [goal_id], max(0.0, deadline - time.monotonic()))

    with_stores(settings, delete)
    return 0


async def _drain(stores: Stores, name: str, deadline: float) -> None:
    """Wait until deployment ``name`` holds no request, queued or running (an endpoint holds none): what a traffic
    change moved off it, it answers first. RequestTimeoutError, deleting nothing, when it still holds some at
    ``deadline``."""
    deployment, _endpoint = await stores.desired.find(name)
    if deployment is None:
        return
    senders = sorted(e.name for e in (await stores.desired.endpoints()).values() if name in e.deployments)
    if senders:  # (the delete would be refused after the wait, and the wait would never end: traffic comes on)
        raise ConflictError(f"{name}: endpoint(s) {', '.join(senders)} still send to it: change their traffic first")
    shown = -1
    while held := await stores.status.holding(name):
        if held != shown:
            print(f"  {name}: {held} request(s) queued or running", flush=True)
            shown = held
        if time.monotonic() > deadline:
            raise RequestTimeoutError(f"{name}: still holds {held} request(s), queued or running: not deleted")
        await asyncio.sleep(GOAL_POLL_S)


def cmd_traffic(args: argparse.Namespace, settings: Settings) -> int:
    traffic = _parse_pairs(args.weights, "weight")
    shadow = None if args.shadow is None else _parse_pairs(args.shadow, "shadow fraction")

    async def set_traffic(stores: Stores) -> EndpointConfig:
        return await stores.desired.set_traffic(args.endpoint, traffic, shadow)

    endpoint = with_stores(settings, set_traffic)
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
