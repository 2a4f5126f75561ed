"""Entry point of a replica process: ``python -m streamserve worker NAME [--replica-id ID]``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import redis
import redis.asyncio as aioredis

from streamserve.runtime import tracing
from streamserve.runtime.gc_freeze import freeze_startup_objects
from streamserve.runtime.import_dir import import_from, namesakes_warning
from streamserve.runtime.logging_setup import start_process
from streamserve.runtime.process_exit import end_process
from streamserve.runtime.processes import end_own_group, end_with_own_group, on_stop_signals, role_command
from streamserve.runtime.settings import Settings, checked_argument, forget_gateway_secrets
from streamserve.transport.connections import async_redis, one_shot_redis
from streamserve.wire.config import check_name
from streamserve.wire.errors import ProtocolError
from streamserve.wire.ids import ReplicaID
from streamserve.workers.output_shipper import OutputShipper
from streamserve.workers.replica import Replica

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve worker", description="Run one replica of a deployment.")
    parser.add_argument("deployment", type=checked_argument(check_name), help="the deployment's name")
    parser.add_argument("--replica-id", help="the replica's id, DEPLOYMENT#ID (default: a new one)")
    parser.add_argument(
        "--version",
        dest="pinned_version",
        metavar="VERSION",
        help="serve only while the deployment is at this version (its `version` field or the code version "
        "`status` shows); otherwise exit 1",
    )
    # Set by a worker on itself when it starts again on new code (see restart_command).
    parser.add_argument("--takes-over", help=argparse.SUPPRESS)
    return parser


async def serve(settings: Settings, replica: Callable[[aioredis.Redis], Replica]) -> tuple[int, str, bool]:
    """Run one replica to the end: its exit code, why it should start again ("" when it should not), and whether its
    farm is gone (`up` killed: nobody ends what its process group holds but itself)."""
    redis = async_redis(settings.effective_redis_url)
    running = replica(redis)

    def stop() -> None:
        if running.loading:
            # It holds no request yet, and its constructor runs on a thread nothing can stop: a rollout, a scale-down
            # or a delete waited for it to end (a model's minutes), or for graceful_shutdown_timeout_s (a hung one).
            logger.info("replica %s: stop requested while its code loads: exiting", running.replica_id)
            end_own_group()  # (what its code started so far)
            end_process(0)
        running.request_stop()

    try:
        with on_stop_signals(stop):
            return await running.run(), running.restart_reason, running.farm_gone
    finally:
        await redis.aclose()
        if running.farm_gone:
            # Its scheduler would kill its process group once it ended (scheduler/launcher.py); none is left to.
            ended = end_own_group()
            if ended:
                logger.warning("replica %s: killed %d process(es) left in its group", running.replica_id, ended)


def restart_command(worker_args: list[str], replica_id: ReplicaID) -> list[str]:
    """This worker's own command line (``worker_args``: what followed ``worker``), as a new replica that takes
    over from ``replica_id``."""
    argv, skip = [], False
    for arg in worker_args:
        if skip:
            skip = False
        elif arg in ("--replica-id", "--takes-over"):
            skip = True
        elif not arg.startswith(("--replica-id=", "--takes-over=")):
            argv.append(arg)
    return role_command("worker", *argv, "--takes-over", replica_id.to_str())


def main(argv: list[str]) -> int:
    """``argv``: the arguments after ``streamserve worker``."""
    args, settings = start_process(build_parser(), argv)
    forget_gateway_secrets(role_command("worker", *argv))  # before any user code is imported
    try:
        replica_id = ReplicaID.from_str(args.replica_id) if args.replica_id else ReplicaID.new(args.deployment)
    except ProtocolError as exc:
        print(f"error: --replica-id: {exc} (one is DEPLOYMENT#ID, as `streamserve status` shows)", file=sys.stderr)
        return 2
    if replica_id.deployment != args.deployment:
        print(f"replica id {replica_id} does not belong to deployment {args.deployment!r}", file=sys.stderr)
        return 2
    # Deployments are imported by module path relative to where the farm runs (`up` warns of namesakes there).
    import_from(Path.cwd())
    if settings.supervisor is None and (namesakes := namesakes_warning(Path.cwd())):
        logger.warning("%s", namesakes)

    def replica(redis: aioredis.Redis) -> Replica:
        return Replica(
            settings,
            redis,
            replica_id,
            after_load=freeze_startup_objects,
            pinned_version=args.pinned_version,
            takes_over=args.takes_over,
        )

    with OutputShipper(settings.effective_redis_url, settings.keys.logs(replica_id.deployment), replica_id.to_str()):
        try:
            import uvloop

            code, restart, farm_gone = uvloop.run(serve(settings, replica))
        except ImportError:
            code, restart, farm_gone = asyncio.run(serve(settings, replica))
    if not farm_gone and not restart:
        _drop_logs_if_undeployed(settings, replica_id.deployment)
    if farm_gone:
        # What its code started may start more as it is killed (a pool's thread starts a worker for each that dies):
        # the group goes at once, this process with it, as its last act.
        tracing.flush()
        logging.shutdown()
        end_with_own_group()
    if restart:
        # The same process runs the deployment's new code afresh: modules cannot be re-imported in place.
        logger.info("replica %s: %s; starting again", replica_id, restart)
        tracing.flush()  # exec ends the process without its exit handlers: send its last spans now
        logging.shutdown()
        os.execv(sys.executable, restart_command(argv, replica_id))
    return code


def _drop_logs_if_undeployed(settings: Settings, deployment: str) -> None:
    """The output stream its lines went to, when no such deployment exists (any more): nothing else would ever delete
    it, and `streamserve logs` cannot show it (a `worker` started with a mistyped name left a key for good)."""
    with contextlib.suppress(redis.RedisError):
        # At once or not at all (no retries): the exit waits for nothing (Redis away, it is left).
        client = one_shot_redis(settings.effective_redis_url)
        try:
            if not client.hexists(settings.keys.deployments(), deployment):
                client.delete(settings.keys.logs(deployment))
        finally:
            client.close()
