"""On a real 3-master Redis Cluster: detection, serving across masters, resharding under traffic, long poll, jobs.

Every fixture of this module (settings, start_replica, client, http) runs on the cluster: ``redis_url`` is
overridden below.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.control.long_poll import LongPollSubscriber
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis, is_cluster, sync_redis
from streamserve.wire.errors import UnavailableError
from streamserve.wire.keys import ConfigKey, Keys
from tests.harness.farm import marked_env
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.redis_cluster import LocalRedisCluster
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica
from tests.integration.test_client_left_open import calls_then_asyncio_run_ends
from tests.integration.test_longpoll import change

KEYS = Keys()


@pytest.fixture
def redis_url(cluster_url: str) -> Iterator[str]:
    yield cluster_url


def one_name_per_master(cluster: LocalRedisCluster) -> list[str]:
    """Deployment names whose keys land on each of the cluster's masters, one name per master."""
    by_port: dict[int, str] = {}
    for i in range(100):
        by_port.setdefault(cluster.master_port_of(KEYS.requests(f"d{i}")), f"d{i}")
    assert len(by_port) == len(cluster.ports)
    return list(by_port.values())


def test_a_cluster_is_detected_and_clients_follow_it(cluster_url: str, redis_server: EmbeddedRedis) -> None:
    assert is_cluster(cluster_url)
    assert not is_cluster(redis_server.url)
    assert isinstance(async_redis(cluster_url), aioredis.RedisCluster)
    sync = sync_redis(cluster_url)
    try:
        assert isinstance(sync, redis.RedisCluster)
    finally:
        sync.close()
    assert type(sync_redis(redis_server.url)) is redis.Redis


async def test_deployments_on_every_master_are_served(
    start_replica: StartReplica, client: AsyncClient, redis_cluster: LocalRedisCluster
) -> None:
    names = one_name_per_master(redis_cluster)
    for name in names:
        await start_replica(name=name, init_kwargs={"tag": name})
    answers = await asyncio.gather(*(client.call(name, {"n": i}, timeout=10) for i, name in enumerate(names)))
    assert [a["tag"] for a in answers] == names
    # Each deployment's stream lives on its own master (redis-cli -c would follow the same map).
    homes = {redis_cluster.master_port_of(KEYS.requests(name)) for name in names}
    assert homes == set(redis_cluster.ports)
    for name in names:
        node = redis_cluster.node(redis_cluster.master_port_of(KEYS.requests(name)))
        try:
            assert node.exists(KEYS.requests(name)) == 1
        finally:
            node.close()


async def test_every_priority_level_is_served_from_the_deployments_own_slot(
    start_replica: StartReplica, client: AsyncClient, redis_cluster: LocalRedisCluster
) -> None:
    names = one_name_per_master(redis_cluster)
    for name in names:
        await start_replica(name=name, init_kwargs={"tag": name})
    calls = [client.call(name, level, timeout=10, priority=level) for name in names for level in ("high", "low")]
    answers = await asyncio.gather(*calls)
    assert [(a["tag"], a["body"]) for a in answers] == [(name, level) for name in names for level in ("high", "low")]
    for name in names:  # one slot per deployment: every level's stream beside the others (one script names them all)
        node = redis_cluster.node(redis_cluster.master_port_of(KEYS.requests(name)))
        try:
            slots = {int(node.cluster("keyslot", key)) for key in KEYS.deployment_keys(name)}
            assert len(slots) == 1
            assert all(node.exists(stream) for stream in KEYS.request_streams(name).values())
        finally:
            node.close()


async def test_requests_routed_by_model_stay_in_the_deployments_slot(
    start_replica: StartReplica, client: AsyncClient, redis_cluster: LocalRedisCluster, aredis: aioredis.Redis
) -> None:
    name = one_name_per_master(redis_cluster)[-1]
    replica = await start_replica(name=name, import_path="tests.multiplex_deployments:ModelEcho")
    answers = [await client.call(name, i, timeout=10, model_id="org/m1") for i in range(3)]
    assert [(a["model"], a["loads"], a["body"]) for a in answers] == [
        ("ORG/M1", 1, 0),
        ("ORG/M1", 1, 1),
        ("ORG/M1", 1, 2),
    ]
    replica_id = replica.replica_id.to_str()
    keys = [
        *KEYS.deployment_keys(name),
        KEYS.routed_requests(name, replica_id),
        KEYS.models_of(name, replica_id),
        KEYS.model_holders(name, "org/m1"),
    ]
    node = redis_cluster.node(redis_cluster.master_port_of(KEYS.requests(name)))
    try:
        assert len({int(node.cluster("keyslot", key)) for key in keys}) == 1
        assert node.zrange(KEYS.model_holders(name, "org/m1"), 0, -1) == [replica_id]
        assert node.exists(KEYS.routed_requests(name, replica_id))
    finally:
        node.close()


async def test_a_deployment_moved_to_another_master_mid_traffic_loses_no_request(
    start_replica: StartReplica, http: httpx.AsyncClient, client: AsyncClient, redis_cluster: LocalRedisCluster
) -> None:
    await start_replica(name="rec", route_prefix="/rec")
    home = redis_cluster.master_port_of(KEYS.requests("rec"))
    target = next(port for port in redis_cluster.ports if port != home)
    statuses: list[int] = []
    results: list[object] = []

    async def traffic() -> None:
        for i in range(300):
            resp = await http.post("/rec", json=i)
            statuses.append(resp.status_code)
            results.append(await client.call("rec", i, timeout=10))

    async def reshard() -> None:
        await wait_for_async(lambda: len(statuses) >= 50, 30, "the traffic did not get going", interval_s=0.01)
        await asyncio.to_thread(redis_cluster.move_slot_of, KEYS.requests("rec"), target)

    await asyncio.gather(traffic(), reshard())
    assert redis_cluster.master_port_of(KEYS.requests("rec")) == target  # it did move, under the traffic
    assert statuses == [200] * 300
    assert [r["body"] for r in results] == list(range(300))  # type: ignore[index]


async def test_long_poll_on_a_cluster_catches_up_after_its_connection_is_killed(
    cluster_url: str, redis_cluster: LocalRedisCluster
) -> None:
    seen: list[set[str]] = []

    async def on_change(changed: set[str]) -> None:
        seen.append(changed)

    sub_redis, writer = async_redis(cluster_url), async_redis(cluster_url)
    # A long resync interval: only the published message or the reconnect delivers a change in time.
    sub = LongPollSubscriber(sub_redis, KEYS, lambda key: True, on_change, resync_interval_s=60)
    try:
        await sub.start()
        await change(writer, ConfigKey.DEPLOYMENTS)
        await wait_for_async(lambda: {ConfigKey.DEPLOYMENTS} in seen, 10, "the first change was not heard")
        for port in redis_cluster.ports:  # every node: wherever the subscription lives
            node = redis_cluster.node(port)
            try:
                node.client_kill_filter(_type="pubsub")
            finally:
                node.close()
        await change(writer, ConfigKey.ENDPOINTS)
        await wait_for_async(lambda: any(ConfigKey.ENDPOINTS in s for s in seen), 10, "not heard after the reconnect")
    finally:
        await sub.close()
        await sub_redis.aclose()
        await writer.aclose()


def run_streamserve(cluster_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STREAMSERVE, *args, "--redis-url", cluster_url],
        cwd=ROOT,
        env=marked_env("cluster-jobs", env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_jobs_without_a_jobs_redis_are_refused_at_start_naming_the_fix(cluster_url: str, tmp_path: Path) -> None:
    scheduler = run_streamserve(cluster_url, "scheduler")
    assert scheduler.returncode == 2, scheduler.stderr
    assert "is a Redis Cluster" in scheduler.stderr and "STREAMSERVE_JOBS_REDIS_URL" in scheduler.stderr
    assert "CROSSSLOT" not in scheduler.stderr
    config = tmp_path / "farm.yaml"
    config.write_text("deployments: []\n")
    up = run_streamserve(cluster_url, "up", str(config), "--port", str(free_port()))
    assert up.returncode != 0
    assert "STREAMSERVE_JOBS_REDIS_URL" in up.stderr and "STREAMSERVE_JOB_WORKERS=0" in up.stderr


async def test_a_job_sent_to_a_cluster_without_a_jobs_redis_gets_503_naming_the_fix(
    start_replica: StartReplica, http: httpx.AsyncClient, settings: Settings
) -> None:
    await start_replica(name="rec", route_prefix="/rec")
    resp = await http.post("/rec", json=1, headers={"Prefer": "respond-async"})
    assert resp.status_code == 503, resp.text
    assert "STREAMSERVE_JOBS_REDIS_URL" in resp.json()["message"]
    async with AsyncClient(settings=settings) as client:
        with pytest.raises(UnavailableError, match="STREAMSERVE_JOBS_REDIS_URL") as refused:
            await client.submit_job("rec", 1)
    assert ("STREAMSERVE_JOB_WORKERS=0" in str(refused.value)) is (settings.job_workers != 0)
    async with AsyncClient(settings=settings.model_copy(update={"job_workers": 0})) as without_jobs:
        with pytest.raises(UnavailableError) as refused:  # (jobs are off already: only the other fix is named)
            await without_jobs.submit_job("rec", 1)
    assert "STREAMSERVE_JOBS_REDIS_URL" in str(refused.value) and "JOB_WORKERS=0" not in str(refused.value)
    assert (await http.post("/rec", json=2)).status_code == 200  # serving is not affected


async def test_asyncio_run_ends_after_calls_with_a_cluster_client_left_open(
    start_replica: StartReplica, cluster_url: str
) -> None:
    await start_replica()
    await calls_then_asyncio_run_ends(cluster_url)
