"""`streamserve health` as an exec probe sees it: 0 only when a scheduler leads and every deployment is HEALTHY."""

from __future__ import annotations

import re
import signal
import subprocess

import redis.asyncio as aioredis

from streamserve.cli.health import farm_problems
from streamserve.cli.inspection import NO_LEADER
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.scheduler.leader import LeaderLock
from streamserve.scheduler.store import RedisReplicaStore
from streamserve.transport.connections import redacted
from streamserve.transport.redis_waits import READ_REDIS_WAIT_S
from streamserve.wire.keys import LEADER_LOCK_TTL_S
from streamserve.wire.messages import DeploymentHealthRecord, now_ms
from streamserve.wire.states import DeploymentHealth
from tests.harness.paths import STREAMSERVE
from tests.integration.conftest import deploy


def health(redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STREAMSERVE, "health", "--redis-url", redis_url], capture_output=True, text=True, timeout=30, check=False
    )


async def judge(settings: Settings, aredis: aioredis.Redis, name: str, verdict: DeploymentHealth, why: str) -> None:
    record = DeploymentHealthRecord(health=verdict, message=why, running=1, updated_ms=now_ms())
    await RedisReplicaStore(aredis, settings.keys).save_health(name, record)


async def test_no_leading_scheduler_is_unhealthy(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, name="rec")
    await judge(settings, aredis, "rec", DeploymentHealth.HEALTHY, "")
    result = health(settings.effective_redis_url)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["no scheduler leads: none is running, or none reaches Redis"]


async def test_status_says_when_its_figures_are_nobodys(settings: Settings, aredis: aioredis.Redis) -> None:
    """Without a leading scheduler, the last verdicts stay in Redis: `status` says they are stale."""
    await deploy(settings, name="rec")
    await judge(settings, aredis, "rec", DeploymentHealth.HEALTHY, "")
    status = [STREAMSERVE, "status", "--redis-url", settings.effective_redis_url]
    alone = subprocess.run(status, capture_output=True, text=True, timeout=30, check=True).stdout
    assert NO_LEADER in alone and "HEALTHY" in alone
    assert await LeaderLock(aredis, settings.keys, ttl_s=30).acquire_or_renew()
    led = subprocess.run(status, capture_output=True, text=True, timeout=30, check=True).stdout
    assert NO_LEADER not in led


async def test_a_leader_and_healthy_deployments_are_healthy(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, name="rec")
    await judge(settings, aredis, "rec", DeploymentHealth.HEALTHY, "")
    assert await LeaderLock(aredis, settings.keys, ttl_s=30).acquire_or_renew()
    result = health(settings.effective_redis_url)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("healthy")


async def test_a_leader_that_stopped_renewing_its_lead_is_unhealthy(settings: Settings, aredis: aioredis.Redis) -> None:
    """A scheduler that died left its lock naming it for the rest of its TTL, and the replicas that died with it read
    RUNNING: `health` said healthy for 5-6 s. A lock renewed every tick that has gone 3.5 s without is a stopped
    leader."""
    await deploy(settings, name="rec")
    await judge(settings, aredis, "rec", DeploymentHealth.HEALTHY, "")
    assert await LeaderLock(aredis, settings.keys).acquire_or_renew()  # just renewed: healthy
    assert await farm_problems(aredis, settings.keys) == []
    await aredis.set(settings.keys.scheduler_lock(), "sched-1", px=int(1000 * LEADER_LOCK_TTL_S) - 3500)
    [said] = await farm_problems(aredis, settings.keys)  # (in-process: the lock lapses 1.5 s from now)
    assert re.match(r"the leading scheduler \(sched-1\) has not renewed its lead for 3\.\ds: it stopped", said), said


async def test_each_deployment_that_is_not_healthy_is_named_with_its_reason(
    settings: Settings, aredis: aioredis.Redis
) -> None:
    for name in ("good", "broken", "waiting"):
        await deploy(settings, name=name)
    await judge(settings, aredis, "good", DeploymentHealth.HEALTHY, "")
    await judge(settings, aredis, "broken", DeploymentHealth.UNHEALTHY, "ImportError: no module named nope")
    assert await LeaderLock(aredis, settings.keys, ttl_s=30).acquire_or_renew()
    result = health(settings.effective_redis_url)  # "waiting" has no verdict yet
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["broken: UNHEALTHY: ImportError: no module named nope", "waiting: PENDING"]


def test_an_unreachable_redis_is_unhealthy_and_says_so() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = health(url)
    assert result.returncode == 1
    assert f"error: cannot reach Redis at {url}" in result.stderr and "Traceback" not in result.stderr


def test_a_redis_that_hangs_is_a_problem_within_the_probes_bound() -> None:
    """An exec probe waited as long as Redis hung (35 s and more), and a hang shorter than that said healthy."""
    server = EmbeddedRedis(port=free_port()).start()
    try:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        result = health(server.url)  # (within its 30 s: the hang outlasts them)
    finally:
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert f"error: Redis at {redacted(server.url)} did not answer within {READ_REDIS_WAIT_S:g}s" in result.stderr
