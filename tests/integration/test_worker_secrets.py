"""A worker started by hand with the gateway's environment (a systemd unit or compose service sharing one env file)
gives its user code neither the API key nor the tenant keys file; the scheduler's job workers get neither either."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamserve import Client
from streamserve.runtime.settings import API_KEY_ENV, TENANT_KEYS_ENV, Settings
from streamserve.transport.connections import sync_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from tests.harness.farm import Processes, descendants
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

SECRETS = {API_KEY_ENV: "the-admin-token", TENANT_KEYS_ENV: "/etc/streamserve/tenant-keys"}


def test_a_worker_run_with_the_gateways_secrets_hides_them_from_its_handler(
    processes: Processes, settings: Settings
) -> None:
    processes.extra_env.update(SECRETS)
    cfg = DeploymentConfig(
        name="env", import_path="tests.deployments:streamserve_environment", external_scaler_enabled=True
    )
    with Client(settings.effective_redis_url) as client:
        client.deploy(AppConfig(deployments=[cfg]))
        processes.spawn("worker-env", "worker", "env")
        redis = sync_redis(settings.effective_redis_url)
        try:
            beats = settings.keys.heartbeats("env")
            wait_for(lambda: any(b'"ready"' in v for v in redis.hvals(beats)), 30, "the worker did not start")
        finally:
            redis.close()
        seen = client.call("env", None)
    assert "REDIS_URL" in seen  # what the handler reads is the worker's environment
    assert not set(SECRETS) & set(seen), seen


def test_a_scheduler_run_with_the_gateways_secrets_starts_job_workers_without_them(processes: Processes) -> None:
    processes.extra_env.update({**SECRETS, "STREAMSERVE_JOB_WORKERS": "1"})
    scheduler = processes.spawn("scheduler", "scheduler")

    def job_workers() -> list[int]:
        return [pid for pid, argv in descendants(scheduler.pid).items() if b"job-worker" in argv]

    wait_for(lambda: bool(job_workers()), 30, "the scheduler started no job worker")
    environ = Path(f"/proc/{job_workers()[0]}/environ").read_bytes().split(b"\0")
    names = {entry.partition(b"=")[0].decode() for entry in environ}
    assert "REDIS_URL" in names and not set(SECRETS) & names, names
