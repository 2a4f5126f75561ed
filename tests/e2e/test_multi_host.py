"""A farm across hosts (network namespaces with hostnames of their own, sharing one Redis and nothing else):
requests through either gateway are served by workers on both hosts, and when every process of one host dies
mid-traffic its requests are finished on the other within their deadline, and `status` drops its workers."""

from __future__ import annotations

import os
import secrets
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.netns import Host, Network, netns_unavailable, start_redis
from tests.harness.farm import FAST_HEARTBEATS
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
deployments:
  - name: who
    import_path: tests.deployments:whoami
    external_scaler_enabled: true
    max_ongoing_requests: 2
    request_timeout_s: 30
"""
GATEWAY_PORT = 8000


class Farm:
    """The hosts: ``redis``; ``b`` with a scheduler, a gateway and a worker; ``c`` with a worker and a gateway."""

    def __init__(self, net: Network, log_dir: Path) -> None:
        self.net = net
        self.log_dir = log_dir
        self.redis_url = start_redis(net["redis"], probe_from=net["b"], log=log_dir / "redis.log")
        self.api_key = secrets.token_hex(16)  # a gateway on a non-loopback address needs one

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSERVE_") and k != "REDIS_URL"}
        return {**env, **FAST_HEARTBEATS, "REDIS_URL": self.redis_url, "STREAMSERVE_API_KEY": self.api_key}

    def start(self, host: Host, *args: str) -> None:
        host.popen([STREAMSERVE, *args], log=self.log_dir / f"{host.name}-{args[0]}.log", env=self.env(), cwd=ROOT)

    def cli(self, host: Host, *args: str) -> str:
        result = host.run([STREAMSERVE, *args], timeout_s=60, env=self.env())
        assert result.returncode == 0, f"streamserve {' '.join(args)} on {host.name}: {result.stderr}"
        return result.stdout

    def status(self) -> dict[str, Any]:
        [deployment] = orjson.loads(self.cli(self.net["b"], "status", "--json"))["deployments"]
        return dict(deployment)

    def gateway(self, host: Host) -> str:
        return f"http://{host.ip}:{GATEWAY_PORT}"

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.log_dir.glob("*.log"))


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    with Network(["redis", "b", "c"]) as net:
        farm = Farm(net, tmp_path)
        config = tmp_path / "who.yaml"
        config.write_text(CONFIG)
        b, c = net["b"], net["c"]
        farm.cli(b, "deploy", str(config))
        farm.start(b, "scheduler")
        for host in (b, c):
            farm.start(host, "gateway", "--host", host.ip, "--port", str(GATEWAY_PORT))
            farm.start(host, "worker", "who")

        def up() -> bool:
            hosts = sorted(r["host"] for r in farm.status()["replicas"] if r["state"] == "RUNNING")
            return hosts == ["b", "c"] and all(ready(farm.gateway(h)) for h in (b, c))

        try:
            wait_for(up, 60, "the farm did not come up on both hosts")
            yield farm
        except BaseException:
            print(farm.logs())
            raise


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_either_gateway_is_served_by_workers_on_both_hosts(farm: Farm) -> None:
    for gateway_host in ("b", "c"):
        url = farm.gateway(farm.net[gateway_host])
        served: Counter[str] = Counter()
        with ThreadPoolExecutor(4) as pool:
            for _ in range(10):  # bounded: 40 requests at most per gateway
                replies = list(pool.map(lambda i, u=url: httpx.post(f"{u}/who", json=i, timeout=30), range(4)))
                assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
                served.update(r.json()["host"] for r in replies)
                if set(served) == {"b", "c"}:
                    break
        assert set(served) == {"b", "c"}, f"through {gateway_host}'s gateway, served by {dict(served)}"


def test_a_hosts_death_mid_traffic_loses_no_request(farm: Farm, tmp_path: Path) -> None:
    b, c = farm.net["b"], farm.net["c"]
    release = tmp_path / "release"
    body = {"wait_for": str(release)}
    with ThreadPoolExecutor(4) as pool:
        # Four held requests through b's gateway: each worker takes two (max_ongoing_requests).
        held = [pool.submit(httpx.post, f"{farm.gateway(b)}/who", json=body, timeout=40) for _ in range(4)]

        def both_busy() -> bool:
            ongoing = {r["host"]: r["ongoing"] for r in farm.status()["replicas"]}
            return ongoing == {"b": 2, "c": 2}

        wait_for(both_busy, 20, "the held requests did not reach both hosts")
        c.kill_all()  # every process of host c: its worker, mid-request, and its gateway
        release.touch()
        replies = [f.result(timeout=40) for f in held]
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    assert {r.json()["host"] for r in replies} == {"b"}  # c's two were re-queued and finished on b

    wait_for(lambda: [r["host"] for r in farm.status()["replicas"]] == ["b"], 20, "status still shows host c")
    assert farm.status()["dead_letters"] == 0
