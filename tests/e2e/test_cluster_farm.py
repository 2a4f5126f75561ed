"""The end-to-end scenarios on a real 3-master Redis Cluster (tests/harness/redis_cluster.py).

The farm runs every deployment of config.yaml and autoscale.yaml, with asynchronous jobs on a single Redis
of their own (STREAMSERVE_JOBS_REDIS_URL). The scenarios are the standalone farm's own tests, imported here
so that they run again with this module's ``farm``: serving, scaling, a rolling update, a traffic split,
kill -9 of a replica with requests in flight, autoscaling from zero, jobs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.wire.keys import Keys
from tests.e2e.test_autoscaling import (  # noqa: F401 (collected here, on the cluster)
    test_first_request_to_an_idle_deployment_waits_for_a_replica_and_succeeds,
)
from tests.e2e.test_endpoints import test_endpoint_splits_mirrors_and_follows_traffic_changes  # noqa: F401
from tests.e2e.test_jobs import test_prefer_respond_async_answers_202_and_the_job_url_shows_the_result  # noqa: F401
from tests.e2e.test_recovery import test_requests_held_by_a_killed_replica_complete_elsewhere  # noqa: F401
from tests.e2e.test_serving import (  # noqa: F401
    test_http_post_answers_with_result_and_headers,
    test_kill_9_replica_is_replaced,
    test_python_client_call_submit_send,
    test_scale_and_status_table,
)
from tests.e2e.test_updates import (  # noqa: F401
    test_user_config_and_max_ongoing_change_live_without_restarts,
    test_version_change_rolls_replicas_while_traffic_succeeds,
)
from tests.harness.farm import FAST_HEARTBEATS, Farm, running_farm
from tests.harness.redis_cluster import LocalRedisCluster, redis_cli_binary

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent


def both_configs(path: Path) -> Path:
    """config.yaml's deployments and autoscale.yaml's, in one config file."""
    deployments = [
        d
        for name in ("config.yaml", "autoscale.yaml")
        for d in yaml.safe_load((HERE / name).read_text())["deployments"]
    ]
    path.write_text(yaml.safe_dump({"deployments": deployments}))
    return path


@pytest.fixture(scope="module")
def farm(redis_cluster: LocalRedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    redis_cluster.flushall()
    workdir = tmp_path_factory.mktemp("cluster-farm")
    with EmbeddedRedis(port=free_port()) as jobs_redis:
        env = {**FAST_HEARTBEATS, "STREAMSERVE_JOBS_REDIS_URL": jobs_redis.url}
        with running_farm(both_configs(workdir / "farm.yaml"), workdir, redis_cluster.url, env) as farm:
            yield farm
    redis_cluster.flushall()


def test_deployments_spread_over_the_masters_and_redis_cli_c_shows_them(
    farm: Farm, redis_cluster: LocalRedisCluster
) -> None:
    keys = Keys()
    homes = {redis_cluster.master_port_of(keys.requests(name)) for name in farm.status()}
    assert homes == set(redis_cluster.ports)  # six deployments, every one of the three masters holds some

    def cli(*args: str) -> str:
        cmd = [redis_cli_binary(), "-c", "-u", redis_cluster.url, *args]  # -c: follow the cluster's redirections
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout

    assert orjson.loads(cli("HGET", "{streamserve}:deployments", "echo"))["import_path"] == "examples.echo:Echo"
    assert "replicas" in cli("XINFO", "GROUPS", "streamserve:{echo}:requests")
    assert '"state":"RUNNING"' in cli("HGETALL", "streamserve:{slow}:replicas")
