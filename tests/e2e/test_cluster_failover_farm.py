"""`streamserve up` on a Redis Cluster with a replica per master, and one master killed -9 while the farm is idle.

Every master refuses every command (CLUSTERDOWN) from the moment the cluster marks the dead one failed until its
replica has taken over: the deployment's own master too. The farm's processes ride that out as they ride out a lost
connection: none exits, and the same ones serve again afterwards. When the master killed is the node the farm's URL
names, the processes started afterwards (a replacement replica) still find the cluster, through the nodes their
scheduler hands them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from streamserve.wire.keys import Keys
from tests.harness.farm import FAST_HEARTBEATS, Farm
from tests.harness.redis_cluster import LocalRedisCluster
from tests.harness.waiting import wait_for

pytestmark = [
    pytest.mark.e2e,
    # A failover makes redis-py drop its objects for the nodes that moved, sometimes with a socket still open.
    pytest.mark.filterwarnings("ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"),
]

KEYS = Keys()
CONFIG = """
deployments:
  - name: {name}
    import_path: examples.echo:Echo
    num_replicas: 1
    route_prefix: /echo
    graceful_shutdown_timeout_s: 2
"""
# Jobs cannot live on a cluster (docs/operations.md); these farms run without.
ENV = {**FAST_HEARTBEATS, "STREAMSERVE_JOB_WORKERS": "0"}


@pytest.fixture
def cluster() -> Iterator[LocalRedisCluster]:
    """Three masters, each with a replica; one per test (each test fails a master over)."""
    with LocalRedisCluster(replicas=1) as cluster:
        yield cluster


def name_on(cluster: LocalRedisCluster, wanted: set[int]) -> str:
    """A deployment name whose keys live on one of the masters at ``wanted``."""
    return next(f"d{i}" for i in range(1000) if cluster.master_port_of(KEYS.requests(f"d{i}")) in wanted)


def start_farm(cluster: LocalRedisCluster, name: str, workdir: Path) -> Farm:
    config = workdir / "farm.yaml"
    config.write_text(CONFIG.format(name=name))
    farm = Farm(config, workdir / "up.log", redis_url=cluster.url, extra_env=ENV)
    farm.start()
    return farm


def fails(farm: Farm, why: str) -> Callable[[], str]:
    """What a wait that failed says: ``why``, and the end of `up`'s output (read then, not before)."""
    return lambda: str(farm.fail(why))


def serves(farm: Farm) -> bool:
    try:
        response = httpx.post(farm.base_url + "/echo", json={"x": 1}, headers={"X-Request-Timeout": "2"}, timeout=5)
    except httpx.HTTPError:
        return False
    assert response.status_code != 500, response.text
    return response.status_code == 200


def fail_over(cluster: LocalRedisCluster, victim: int) -> None:
    """kill -9 the master at ``victim`` and wait until its replica has taken over its slots."""
    its_key = KEYS.requests(name_on(cluster, {victim}))
    cluster.kill_node(victim)
    wait_for(lambda: cluster.master_port_of(its_key) != victim, 30, "no replica took over")


def test_a_master_with_no_slot_of_the_deployment_fails_over_and_the_same_processes_serve_again(
    cluster: LocalRedisCluster, tmp_path: Path
) -> None:
    seed = cluster.ports[0]  # the farm's URL names it: it stays up here
    masters = {cluster.master_port_of(KEYS.requests(f"d{i}")) for i in range(50)}
    victim = min(masters - {seed, cluster.master_port_of(KEYS.deployments())})
    farm = start_farm(cluster, name_on(cluster, masters - {victim}), tmp_path)
    try:
        wait_for(lambda: serves(farm), 30, fails(farm, "the farm did not serve"))
        before = farm.role_pids()
        assert len(before["worker"]) == 1, before

        fail_over(cluster, victim)
        wait_for(lambda: serves(farm), 30, fails(farm, "the farm did not serve after the failover"))
        after = farm.role_pids()
        for role in ("worker", "gateway", "scheduler"):
            assert after[role] == before[role], farm.fail(f"the {role} was not the same after the failover")
    finally:
        farm.stop()


def test_a_replacement_replica_starts_when_the_urls_node_has_failed_over(
    cluster: LocalRedisCluster, tmp_path: Path
) -> None:
    seed = cluster.ports[0]  # the farm's URL names it, and only it
    masters = {cluster.master_port_of(KEYS.requests(f"d{i}")) for i in range(50)}
    assert seed in masters
    farm = start_farm(cluster, name_on(cluster, masters - {seed}), tmp_path)
    try:
        wait_for(lambda: serves(farm), 30, fails(farm, "the farm did not serve"))
        [worker] = farm.role_pids()["worker"]

        fail_over(cluster, seed)
        wait_for(lambda: serves(farm), 30, fails(farm, "the farm did not serve after the failover"))
        os.kill(worker, signal.SIGKILL)  # its scheduler starts a replacement, which knows only the URL's node

        def replaced() -> bool:
            return worker not in farm.role_pids().get("worker", [worker]) and serves(farm)

        wait_for(replaced, 30, fails(farm, "no replacement replica served"))
    finally:
        farm.stop()
