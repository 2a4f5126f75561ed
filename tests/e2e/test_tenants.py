"""Tenants end to end (issue 30): `streamserve up`, its gateway, scheduler and replica processes, a second gateway,
HTTP callers with ``X-Tenant`` or an API key, and the Python client with ``tenant=``.

What ran is what the handler recorded on a Redis list (tests/priority_deployments.py)."""

from __future__ import annotations

import concurrent.futures
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from streamserve import BadRequestError, Client, RateLimitedError
from streamserve.runtime.processes import free_port
from streamserve.wire.keys import Keys
from streamserve.wire.tenants import OTHER_TENANTS
from tests.harness.farm import Farm, Processes, running_farm_of
from tests.harness.paths import ROOT, STREAMSERVE
from tests.harness.waiting import wait_for
from tests.priority_deployments import order_key

pytestmark = pytest.mark.e2e

METERED = """\
  - name: metered
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_ongoing_requests: 4
    graceful_shutdown_timeout_s: 2
    tenant_limits:
      default: {requests_per_s: RATE, burst: 3}
      gold: {requests_per_s: 1000, burst: 1000}
"""
CONFIG = (
    "deployments:\n"
    + METERED.replace("RATE", "0.1")
    + """\
  - name: shared
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 2
    tenant_limits:
      default: {max_queued: 2}
  - name: counted
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_ongoing_requests: 16
    graceful_shutdown_timeout_s: 2
  - name: cached
    import_path: tests.priority_deployments:ordered
    num_replicas: 1
    max_ongoing_requests: 16
    graceful_shutdown_timeout_s: 2
    response_cache: {}
"""
)
KEYS = Keys()
WAIT_S = 30.0


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("tenants")) as farm:
        yield farm


def post(url: str, path: str, tag: str, tenant: str | None = None, **more: object) -> httpx.Response:
    headers = {"X-Tenant": tenant} if tenant is not None else {}
    return httpx.post(url + path, json={"tag": tag, "label": tenant or "-", **more}, headers=headers, timeout=60)


def ran(store: redis.Redis, tag: str) -> list[str]:
    return [label.decode() for label in store.lrange(order_key(tag), 0, -1)]


def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_no_other_tenant_is_slowed(
    farm: Farm, client: Client, tag: str
) -> None:
    acme = f"acme-{tag}"
    codes = [post(farm.base_url, "/metered", tag, acme).status_code for _ in range(3)]
    assert codes == [200, 200, 200]  # its burst
    refused = post(farm.base_url, "/metered", tag, acme)
    assert refused.status_code == 429
    assert refused.json()["error"] == "RateLimitedError"
    assert f"tenant '{acme}' is over its rate on deployment 'metered'" in refused.json()["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 10  # a token every 10 s
    with pytest.raises(RateLimitedError, match="over its rate") as from_python:
        client.call("metered", {"tag": tag, "label": "py"}, tenant=acme)
    assert 0 < from_python.value.retry_after_s <= 10
    # Other tenants have buckets of their own, the default tenant too, and gold a bigger one.
    assert post(farm.base_url, "/metered", tag, f"globex-{tag}").status_code == 200
    assert [post(farm.base_url, "/metered", tag, "gold").status_code for _ in range(20)] == [200] * 20
    # Who is limited, as status shows it (and the dashboard, from the same figures).
    assert acme in farm.status()["metered"]["limited_tenants"]
    assert f"metered: tenants over their limits in the last minute: {acme}" in farm.cli("status").stdout


def test_limits_hold_across_two_gateways(farm: Farm, tag: str, tmp_path: Path) -> None:
    processes = Processes(farm.effective_redis_url, tmp_path)
    try:
        urls = [farm.base_url, processes.start_gateway().url]
        codes = [post(urls[i % 2], "/metered", tag, f"pair-{tag}").status_code for i in range(8)]
    finally:
        processes.stop_all()
    assert sorted(codes) == [200] * 3 + [429] * 5, codes  # one bucket of 3, whichever gateway took each


def test_a_tenant_over_its_queued_share_gets_429_until_one_of_its_requests_ends(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    acme = f"acme-{tag}"
    first = pool.submit(post, farm.base_url, "/shared", tag, acme, hold=hold)  # runs, and holds the replica
    wait_for(lambda: len(ran(store, tag)) == 1, WAIT_S, "the first request did not start")
    second = pool.submit(post, farm.base_url, "/shared", tag, acme)
    wait_for(lambda: store.zcard(KEYS.tenant_held("shared", acme)) == 2, WAIT_S, "the second was not queued")
    third = post(farm.base_url, "/shared", tag, acme)
    assert third.status_code == 429
    assert third.headers["retry-after"] == "1"
    assert (
        f"tenant '{acme}' has reached its max_queued of 2 requests queued or running on deployment 'shared'"
        in third.json()["message"]
    )
    other = pool.submit(post, farm.base_url, "/shared", tag, f"globex-{tag}")  # another tenant: queued at once
    store.delete(hold)
    assert [f.result(timeout=WAIT_S).status_code for f in (first, second, other)] == [200, 200, 200]
    wait_for(lambda: store.zcard(KEYS.tenant_held("shared", acme)) == 0, WAIT_S, "finished requests still count")
    assert post(farm.base_url, "/shared", tag, acme).status_code == 200


def test_a_job_over_its_tenants_share_waits_for_its_turn(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    acme = f"acme-{tag}"
    held = [pool.submit(post, farm.base_url, "/shared", tag, acme, hold=hold) for _ in range(2)]
    wait_for(lambda: store.zcard(KEYS.tenant_held("shared", acme)) == 2, WAIT_S, "the share did not fill")
    headers = {"X-Tenant": acme, "Prefer": "respond-async"}
    accepted = httpx.post(farm.base_url + "/shared", json={"tag": tag, "label": "job"}, headers=headers, timeout=30)
    assert accepted.status_code == 202  # a job is accepted whatever its tenant's limits say
    job_url = farm.base_url + accepted.headers["location"]
    wait_for(lambda: httpx.get(job_url, timeout=30).json()["status"] == "started", WAIT_S, "the job did not start")
    assert "job" not in ran(store, tag)  # its call waits for a place of its tenant's
    store.delete(hold)
    assert [f.result(timeout=WAIT_S).status_code for f in held] == [200, 200]
    wait_for(lambda: httpx.get(job_url, timeout=30).json()["status"] == "finished", WAIT_S, "the job did not run")
    assert "job" in ran(store, tag)


def test_a_flooding_tenant_is_refused_while_every_request_of_another_is_served(
    farm: Farm, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    flood = [pool.submit(post, farm.base_url, "/shared", tag, f"flood-{tag}", work_s=0.05) for _ in range(60)]
    quiet = [post(farm.base_url, "/shared", tag, f"quiet-{tag}") for _ in range(10)]
    flooded = [f.result(timeout=WAIT_S * 2).status_code for f in flood]
    assert [q.status_code for q in quiet] == [200] * 10
    assert flooded.count(429) > 0 and set(flooded) <= {200, 429}
    # bench/priority_bench.py measures the quiet tenant's latency beside the same without a flood.


def test_new_limits_apply_with_a_deploy_and_restart_nothing(
    farm: Farm, store: redis.Redis, tag: str, tmp_path: Path
) -> None:
    slow = f"slow-{tag}"
    assert [post(farm.base_url, "/metered", tag, slow).status_code for _ in range(4)] == [200, 200, 200, 429]
    pids = {r["pid"] for r in farm.status()["metered"]["replicas"]}
    config = tmp_path / "faster.yaml"
    config.write_text("deployments:\n" + METERED.replace("RATE", "1000"))
    try:
        farm.cli("deploy", str(config))
        wait_for(lambda: post(farm.base_url, "/metered", tag, slow).status_code == 200, WAIT_S, "limits unchanged")
        assert {r["pid"] for r in farm.status()["metered"]["replicas"]} == pids  # the same replica serves on
    finally:
        config.write_text("deployments:\n" + METERED.replace("RATE", "0.1"))
        farm.cli("deploy", str(config))


@pytest.mark.parametrize("header", ["", "a b", "-x", "t" * 65, "a|b"])
def test_a_tenant_header_that_is_not_a_tenant_name_is_400(
    farm: Farm, store: redis.Redis, client: Client, tag: str, header: str
) -> None:
    answer = post(farm.base_url, "/counted", tag, header)
    assert answer.status_code == 400
    assert "X-Tenant: tenant" in answer.json()["message"] and "is not a tenant name" in answer.json()["message"]
    with pytest.raises(BadRequestError, match="is not a tenant name"):
        client.call("counted", {"tag": tag, "label": "x"}, tenant=header)
    assert ran(store, tag) == []


def metric_lines(farm: Farm, deployment: str) -> list[str]:
    text = httpx.get(farm.base_url + "/metrics", timeout=30).text
    return [
        line
        for line in text.splitlines()
        if line.startswith("streamserve_tenant_requests_total{") and f'deployment="{deployment}"' in line
    ]


def test_requests_are_counted_by_tenant_and_code_with_at_most_100_tenants_labelled(
    farm: Farm, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    tenants = [f"t{i}-{tag}" for i in range(110)]
    answers = list(pool.map(lambda t: post(farm.base_url, "/counted", tag, t), tenants))
    assert {a.status_code for a in answers} == {200}

    def all_counted() -> bool:
        total = sum(float(line.rsplit(" ", 1)[1]) for line in metric_lines(farm, "counted"))
        return total >= 110

    wait_for(all_counted, WAIT_S, "the requests were not counted")
    labelled = {line.split('tenant="', 1)[1].split('"', 1)[0] for line in metric_lines(farm, "counted")}
    assert len(labelled) == 101 and OTHER_TENANTS in labelled  # 100 tenants, and the rest together
    refused = [line for line in metric_lines(farm, "metered") if 'code="429"' in line]
    assert refused, "the 429s of the rate test were not counted"


def test_a_refused_header_is_counted_under_its_tenant_and_other_is_a_tenant_of_its_own(farm: Farm, tag: str) -> None:
    """A 400 for a bad X-Priority counts under the request's tenant (its tenant is read first), and a tenant named
    `other` gets its own label, apart from the overflow of unlabelled tenants."""
    for tenant, priority in ((f"bad-{tag}", "urgent"), ("other", "normal")):
        headers = {"X-Tenant": tenant, "X-Priority": priority}
        answer = httpx.post(farm.base_url + "/metered", json={"tag": tag, "label": "h"}, headers=headers, timeout=30)
        assert answer.status_code == (400 if priority == "urgent" else 200), answer.text

    def counted() -> bool:
        lines = metric_lines(farm, "metered")
        bad = any(f'tenant="bad-{tag}"' in line and 'code="400"' in line for line in lines)
        return bad and any('tenant="other"' in line and 'code="200"' in line for line in lines)

    wait_for(counted, WAIT_S, lambda: f"not counted as expected: {metric_lines(farm, 'metered')}")


def test_a_malformed_tenant_header_is_counted_under_its_deployment(farm: Farm, tag: str) -> None:
    """Its tenant is unknown (so not labelled), but the 400 is one of the route's requests."""

    def refused_count() -> float:
        text = httpx.get(farm.base_url + "/metrics", timeout=30).text
        prefix = 'streamserve_requests_total{code="400",deployment="counted"} '
        return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))

    before = refused_count()
    for bad in ("a b", "x" * 200, "a/b"):
        answer = httpx.post(farm.base_url + "/counted", json={"tag": tag}, headers={"X-Tenant": bad}, timeout=30)
        assert answer.status_code == 400 and "X-Tenant" in answer.json()["message"], answer.text
    wait_for(lambda: refused_count() >= before + 3, WAIT_S, lambda: f"counted {refused_count() - before} of 3")


def test_idempotency_keys_and_kept_replies_are_each_tenants_own(farm: Farm, store: redis.Redis, tag: str) -> None:
    """Another tenant's same key (or same request to a cached deployment) runs for that tenant: it never gets a
    reply kept for another tenant, nor a 422 that tells it another tenant used the key."""
    acme, globex, initech = (f"{name}-{tag}" for name in ("acme", "globex", "initech"))
    key = f"order-{tag}"

    def send(path: str, tenant: str, label: str = "same", **headers: str) -> httpx.Response:
        headers = {"X-Tenant": tenant, **headers}
        return httpx.post(farm.base_url + path, json={"tag": tag, "label": label}, headers=headers, timeout=60)

    assert send("/counted", acme, **{"Idempotency-Key": key}).status_code == 200
    replayed = send("/counted", acme, **{"Idempotency-Key": key})
    assert replayed.headers.get("idempotent-replayed") == "true"
    theirs = send("/counted", globex, **{"Idempotency-Key": key})
    assert theirs.status_code == 200 and "idempotent-replayed" not in theirs.headers
    other_body = send("/counted", initech, "other", **{"Idempotency-Key": key})
    assert other_body.status_code == 200, other_body.text  # not 422: initech never sent this key
    assert ran(store, tag) == ["same", "same", "other"]

    assert [send("/cached", tenant).headers["x-cache"] for tenant in (acme, acme, globex)] == ["miss", "hit", "miss"]
    assert ran(store, tag)[3:] == ["same", "same"]

    async_key = {"Idempotency-Key": f"job-{tag}", "Prefer": "respond-async"}
    jobs = [send("/counted", tenant, "job", **async_key).json()["job_id"] for tenant in (acme, globex, acme)]
    assert jobs[0] == jobs[2] != jobs[1]


KEY_ACME = "acme-" + "k" * 27
KEY_GLOBEX = "globex-" + "k" * 25


def test_with_tenant_keys_a_request_needs_a_known_key_which_decides_its_tenant(
    farm: Farm, tmp_path: Path, tag: str
) -> None:
    keys = tmp_path / "tenant-keys"
    keys.write_text(f"# key tenant\n{KEY_ACME} acme-keyed\n{KEY_GLOBEX} globex-keyed\n")
    processes = Processes(farm.effective_redis_url, tmp_path, {"STREAMSERVE_TENANT_KEYS": str(keys)})
    try:
        url = processes.start_gateway().url
        body = {"tag": tag, "label": "k"}
        missing = httpx.post(url + "/counted", json=body, timeout=30)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "known API keys only" in missing.json()["message"]
        # Without a key, nothing else of the request is looked at: not its body, nor its path.
        not_json = httpx.post(url + "/counted", content=b"{", headers={"X-Request-Timeout": "x"}, timeout=30)
        assert not_json.status_code == 401
        assert httpx.post(url + "/no-such-route", json=body, timeout=30).status_code == 401
        for method, path in (("GET", "/counted"), ("DELETE", "/counted"), ("GET", "/no-such-route")):  # 405 or 404
            assert httpx.request(method, url + path, timeout=30).status_code == 401, (method, path)
        acme = {"Authorization": f"Bearer {KEY_ACME}"}
        assert httpx.get(url + "/counted", headers=acme, timeout=30).status_code == 405  # told with a key
        assert httpx.get(url + "/-/healthz", timeout=30).status_code == 200  # the gateway's own routes: as ever
        wrong = httpx.post(url + "/counted", json=body, headers={"Authorization": "Bearer " + "x" * 32}, timeout=30)
        assert wrong.status_code == 401
        two = [("Authorization", f"Bearer {KEY_ACME}"), ("Authorization", f"Bearer {KEY_GLOBEX}")]
        both = httpx.post(url + "/counted", json=body, headers=httpx.Headers(two), timeout=30)
        assert both.status_code == 400 and "one Authorization header" in both.json()["message"]
        # The key decides: its X-Tenant is not looked at.
        for _ in range(4):
            headers = {"Authorization": f"Bearer {KEY_ACME}", "X-Tenant": "gold"}
            answer = httpx.post(url + "/metered", json=body, headers=headers, timeout=30)
        assert answer.status_code == 429
        assert "tenant 'acme-keyed' is over its rate" in answer.json()["message"]
        other = httpx.post(url + "/metered", json=body, headers={"Authorization": f"Bearer {KEY_GLOBEX}"}, timeout=30)
        assert other.status_code == 200
    finally:
        processes.stop_all()


def test_a_tenant_keys_file_that_cannot_be_read_stops_the_gateway_at_start(farm: Farm, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-file"
    env = Processes(farm.effective_redis_url, tmp_path, {"STREAMSERVE_TENANT_KEYS": str(missing)}).env()
    port = str(free_port())  # (it never listens: the keys file stops it first)
    for command in (
        ["gateway", "--port", port],
        ["gateway", "--port", port, "--workers", "2"],
        ["up", str(tmp_path / "none.yaml")],
    ):
        result = subprocess.run(
            [STREAMSERVE, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert f"STREAMSERVE_TENANT_KEYS: cannot read {missing}" in result.stderr
