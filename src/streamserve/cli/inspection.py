"""What the farm is doing: ``status``, ``health`` and ``logs``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from streamserve.cli.health import farm_problems
from streamserve.cli.log_reader import DEFAULT_LINES, LogReader, parse_since
from streamserve.cli.stores import Stores, with_stores
from streamserve.cli.tables import format_endpoints, format_status
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RedisRefusals, async_redis
from streamserve.transport.redis_waits import READ_REDIS_WAIT_S, redis_answers_within
from streamserve.wire.errors import ConfigError, NotFoundError
from streamserve.wire.messages import text
from streamserve.wire.printable import printable

# Said under the status tables when no scheduler leads: what they show is nobody's any more.
NO_LEADER = "no scheduler leads (none runs, or none reaches Redis): health and replicas are as the last one left them"


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    async def report(stores: Stores) -> dict[str, Any]:
        return await stores.status.report()

    async def tables(stores: Stores) -> str:
        endpoints = await stores.desired.endpoints()
        text = format_status(await stores.status.status())
        text += "\n\n" + format_endpoints([endpoints[n] for n in sorted(endpoints)]) if endpoints else ""
        if not await stores.scheduler_leads():  # the figures above are nobody's now
            text += "\n\n" + NO_LEADER
        return text

    if args.json:
        sys.stdout.write(orjson.dumps(with_stores(settings, report), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(with_stores(settings, tables))
    return 0


def cmd_health(_args: argparse.Namespace, settings: Settings) -> int:
    """For exec probes: one line per problem and exit 1; Redis unreachable, or not answering within
    READ_REDIS_WAIT_S, is a problem too (main says so)."""
    url = settings.effective_redis_url

    async def check() -> list[str]:
        redis = async_redis(url)
        try:
            with RedisRefusals(url):
                async with redis_answers_within(READ_REDIS_WAIT_S, url):
                    return await farm_problems(redis, settings.keys, settings.tick_interval_s)
        finally:
            await redis.aclose()

    problems = [printable(problem) for problem in asyncio.run(check())]
    print("\n".join(problems) or "healthy: a scheduler leads and every deployment is HEALTHY")
    return 1 if problems else 0


def cmd_logs(args: argparse.Namespace, settings: Settings) -> int:
    """Recent lines (the stream keeps ~10,000 per deployment), then with -f the new ones as they come."""
    try:
        since_s = None if args.since is None else parse_since(args.since)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.lines is not None and args.lines < 1:
        raise ConfigError("--lines must be at least 1")

    async def show(stores: Stores) -> int:
        await stores.desired.get(args.name)  # NotFoundError (exit 1) for an unknown deployment
        reader = LogReader(stores.redis, settings.keys.logs(args.name))
        after = await reader.latest_id()
        if since_s is not None:
            lines = await reader.since(max(0, int((time.time() - since_s) * 1000)), args.replica)  # (or all)
            lines = lines if args.lines is None else lines[-args.lines :]
        else:
            lines = await reader.last(args.lines or DEFAULT_LINES, args.replica)
        for line in lines:
            print(line.format(args.raw))
        sys.stdout.flush()
        if args.replica and not lines and not args.follow:
            replicas = sorted(text(r) for r in await stores.redis.hkeys(settings.keys.replicas(args.name)))
            if not any(r == args.replica or r.partition("#")[2] == args.replica for r in replicas):
                shown = ", ".join(replicas) or "none now"
                raise NotFoundError(
                    f"no output from a replica {args.replica!r} of {args.name!r} (its replicas: {shown})"
                )
        if args.follow:
            async for line in reader.follow(after, args.replica):
                print(line.format(args.raw), flush=True)
        return 0

    return with_stores(settings, show)
