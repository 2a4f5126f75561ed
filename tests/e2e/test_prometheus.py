"""A real Prometheus server (Debian's `prometheus` package) scrapes a running farm's gateway and answers a rate."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamserve.runtime.processes import free_port
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

PROMETHEUS = shutil.which("prometheus")
RATE = 'sum(rate(streamserve_requests_total{deployment="echo",code="200"}[15s]))'
P99 = (
    'histogram_quantile(0.99, sum by (le) (rate(streamserve_request_duration_seconds_bucket{deployment="echo"}[15s])))'
)


def query(port: int, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": promql}, timeout=5)
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def first_value(port: int, promql: str) -> float | None:
    result = query(port, promql)
    return float(result[0]["value"][1]) if result else None


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: install Debian's prometheus package")
def test_prometheus_scrapes_the_farm_and_answers_a_rate(farm: Farm, tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    gateway = farm.base_url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: streamserve\n    static_configs: [{{targets: ['{gateway}']}}]\n"
    )
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, stopped below by id
    )
    try:

        def scraped() -> bool:
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": 'up{job="streamserve"}'}, timeout=5
                )
            except httpx.HTTPError:
                return False
            if answer.status_code != 200:  # 503 while its storage starts
                return False
            up = answer.json()["data"]["result"]
            return bool(up) and up[0]["value"][1] == "1"

        wait_for(scraped, 60, "prometheus never scraped the gateway: " + (tmp_path / "prometheus.log").read_text())

        def rate_seen() -> bool:
            with httpx.Client(base_url=farm.base_url, timeout=10) as http:
                for i in range(20):  # traffic keeps flowing while we wait for the rate
                    assert http.post("/echo", json={"i": i}).status_code == 200
            rate = first_value(port, RATE)
            return rate is not None and rate > 0

        wait_for(rate_seen, 60, "prometheus never saw requests/s above 0")
        running = first_value(port, 'streamserve_replicas{deployment="echo",state="RUNNING"}')
        assert running == farm.status()["echo"]["running"]
        latency = first_value(port, P99)
        assert latency is not None and 0 < latency < 10
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
