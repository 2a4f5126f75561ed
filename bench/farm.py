"""`streamserve up` as the benches run it: tests/harness/farm.py's ``Farm``, started and stopped as a bench child.

It is `up` as a user runs it, with two changes: both ports are free ones (the embedded Redis never takes
6379, which another farm on this machine may be using), and no job workers (``STREAMSERVE_JOB_WORKERS=0``):
no bench submits asynchronous jobs, and two idle RQ workers would only take memory and CPU from what is
measured. Its heartbeats are `up`'s defaults, not the tests' fast ones. Its status is read from Redis
in-process, not by a CLI process: the autoscaling step polls it every 50 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from bench.children import READY_TIMEOUT_S, Children
from tests.harness.farm import Farm, farm_on
from tests.harness.paths import python_path
from tests.harness.waiting import wait_for

NO_JOB_WORKERS = {"STREAMSERVE_JOB_WORKERS": "0"}


def start_farm(
    children: Children,
    config_text: str,
    timeout_s: float = READY_TIMEOUT_S,
    settings: Mapping[str, str] = {},
    up_args: Sequence[str] = (),
) -> Farm:
    """`streamserve up` on ``config_text``, once every deployment runs its target replicas; stopped by children.

    ``settings``: STREAMSERVE_* variables for the farm (the bench's own environment's are not passed on).
    """
    env = {**NO_JOB_WORKERS, **settings, "PYTHONPATH": python_path()}
    farm = farm_on(config_text, children.temporary_directory(), extra_env=env)
    farm.extra_args = list(up_args)
    farm = children.start(farm)
    farm.start(timeout_s)
    wait_running(farm, timeout_s)
    return farm


def status_of(redis_url: str) -> list[dict[str, Any]]:
    """Every deployment's status as dicts (name, target, running, queued, replicas, ...)."""
    from streamserve.control.status import StatusReader
    from streamserve.runtime.settings import Settings
    from streamserve.transport.connections import async_redis

    async def read() -> list[dict[str, Any]]:
        redis = async_redis(redis_url)
        try:
            return [d.to_dict() for d in await StatusReader(redis, Settings(redis_url=redis_url).keys).status()]
        finally:
            await redis.aclose()

    return asyncio.run(read())


def wait_running(farm: Farm, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until every deployment has at least one replica as its target and runs them all."""
    deployments: list[dict[str, Any]] = []

    def running() -> bool:
        nonlocal deployments
        if farm.proc is None or farm.proc.poll() is not None:
            raise farm.fail("`streamserve up` exited")
        deployments = status_of(farm.effective_redis_url)
        return bool(deployments) and all(d["target"] >= 1 and d["running"] >= d["target"] for d in deployments)

    wait_for(running, timeout_s, lambda: str(farm.fail(f"replicas not running: {deployments}")), interval_s=0.2)
