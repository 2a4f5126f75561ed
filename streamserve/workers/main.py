"""Entry point of a replica process: ``python -m streamserve worker NAME [--replica-id ID]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from streamserve.connection import async_redis
from streamserve.heap import freeze_startup_objects
from streamserve.ids import ReplicaID
from streamserve.logs import start_process
from streamserve.procs import on_stop_signals
from streamserve.settings import Settings
from streamserve.workers.replica import Replica

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve worker", description="Run one replica of a deployment.")
    parser.add_argument("deployment", help="the deployment's name")
    parser.add_argument("--replica-id", help="the replica's id (default: a new one)")
    return parser


async def serve(settings: Settings, replica_id: ReplicaID) -> int:
    redis = async_redis(settings.effective_redis_url)
    replica = Replica(settings, redis, replica_id, after_load=freeze_startup_objects)
    try:
        with on_stop_signals(replica.request_stop):
            return await replica.run()
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    args, settings = start_process(build_parser(), argv)
    replica_id = ReplicaID.from_str(args.replica_id) if args.replica_id else ReplicaID.new(args.deployment)
    if replica_id.deployment != args.deployment:
        print(f"replica id {replica_id} does not belong to deployment {args.deployment!r}", file=sys.stderr)
        return 2
    # Deployments are imported by module path relative to where the farm runs.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        import uvloop

        return uvloop.run(serve(settings, replica_id))
    except ImportError:
        return asyncio.run(serve(settings, replica_id))
