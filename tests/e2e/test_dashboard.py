"""The dashboard in a real browser (headless Chromium) against a running farm: rows show the replica counts, a
scale-up shows without a reload, and a screenshot is saved (README's is made by this test: see SCREENSHOT_TO)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from streamserve import Client, RateLimitedError
from tests.e2e.browser import CHROMIUM, Browser
from tests.harness.farm import Farm, running_farm

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium to drive: install Debian's chromium package"),
]

# Set to a path to keep the screenshot there too: SCREENSHOT_TO=docs/dashboard.png pytest tests/e2e/test_dashboard.py
SCREENSHOT_TO = os.environ.get("SCREENSHOT_TO")
CONFIG = """\
deployments:
  - name: echo
    import_path: examples.echo:Echo
    num_replicas: 1
    route_prefix: /echo
    graceful_shutdown_timeout_s: 2
  - name: sleepy
    import_path: examples.sleepy:Sleepy
    init_kwargs: {seconds: 0.02}
    max_ongoing_requests: 4
    route_prefix: /sleepy
    autoscaling_config: {min_replicas: 1, max_replicas: 3, target_ongoing_requests: 2, upscale_delay_s: 0}
    graceful_shutdown_timeout_s: 2
  - name: held
    import_path: examples.sleepy:Sleepy
    init_kwargs: {seconds: 0.01}
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 1
    tenant_limits:
      default: {max_queued: 3}
  - name: stores
    import_path: examples.forecasters:Forecasters
    num_replicas: 1
    graceful_shutdown_timeout_s: 1
endpoints:
  - name: greet
    traffic: {echo: 1.0}
"""
# Traffic while the page is open, so that the charts have lines: bounded in count and time.
TRAFFIC_MAX_REQUESTS = 20_000
TRAFFIC_MAX_S = 90.0


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    with running_farm(config, tmp_path) as farm:
        yield farm


@pytest.fixture
def traffic(farm: Farm) -> Iterator[None]:
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(base_url=farm.base_url, timeout=10) as http:
            for i in range(TRAFFIC_MAX_REQUESTS):
                if stop.wait(0.01):
                    return
                http.post("/greet", json={"i": i})
                if i % 4 == 0:
                    http.post("/sleepy", json={"seconds": 0.02})

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join(TRAFFIC_MAX_S)


def cell(deployment: str, field: str) -> str:
    """JS: the text of one cell of a deployment's row ('' while the row is not there)."""
    selector = f'tr[data-deployment="{deployment}"] [data-field="{field}"]'
    return f"((document.querySelector('{selector}') || {{}}).textContent || '')"


def test_the_dashboard_shows_the_farm_and_follows_a_scale_up_live(farm: Farm, traffic: None, tmp_path: Path) -> None:
    with Browser() as browser:
        assert browser.open(f"{farm.base_url}/-/dashboard") == 200
        browser.wait_for(f"{cell('echo', 'running')} === '1'", 20)
        browser.wait_for(f"{cell('sleepy', 'running')} === '1'", 20)
        assert browser.evaluate(cell("echo", "health")) == "HEALTHY"
        assert browser.evaluate("document.querySelectorAll('tr[data-of=\"echo\"]').length") == 1
        assert "greet" in browser.evaluate("document.querySelector('tr[data-endpoint=\"greet\"]').textContent")
        browser.evaluate("window.notReloaded = true")

        farm.cli("scale", "echo", "2")
        browser.wait_for(f"{cell('echo', 'running')} === '2'", 30)
        assert browser.evaluate("window.notReloaded === true"), "the page was reloaded"
        assert browser.evaluate("document.querySelectorAll('tr[data-of=\"echo\"]').length") == 2
        assert browser.evaluate("document.querySelector('#goals tbody').textContent").count("scale") >= 1

        # The charts draw the last minutes from the scheduler's samples (every 5 s): wait for a line.
        points = "document.querySelector('tr[data-deployment=\"echo\"] polyline')"
        browser.wait_for(f"{points} && {points}.getAttribute('points').split(' ').length >= 3", 40)
        assert browser.evaluate("document.getElementById('banner').classList.contains('shown')") is False
        shot = tmp_path / "dashboard.png"
        browser.screenshot(shot)
        assert shot.read_bytes().startswith(b"\x89PNG")
        if SCREENSHOT_TO:
            Path(SCREENSHOT_TO).write_bytes(shot.read_bytes())


def test_the_dashboard_says_when_the_gateway_cannot_be_reached(farm: Farm) -> None:
    with Browser() as browser:
        browser.open(f"{farm.base_url}/-/dashboard")
        browser.wait_for(f"{cell('echo', 'running')} === '1'", 20)
        farm.stop()  # the whole farm, gateway included: the page stays, its polls fail
        browser.wait_for("document.getElementById('banner').classList.contains('shown')", 20)
        assert "Cannot read the farm" in browser.evaluate("document.getElementById('banner').textContent")
        assert browser.evaluate(cell("echo", "running")) == "1"  # what was last read stays on the page


def test_the_dashboard_shows_queued_requests_by_priority_the_tenants_over_their_limits_and_models_held(
    farm: Farm,
) -> None:
    with Client(farm.effective_redis_url) as client, Browser() as browser:
        client.send("held", {"seconds": 20}, tenant="acme", timeout=25)  # holds the one slot
        for _ in range(2):
            client.send("held", {}, priority="low", tenant="acme")
        with pytest.raises(RateLimitedError):
            client.send("held", {}, tenant="acme")  # a fourth of acme's: over its max_queued
        assert browser.open(f"{farm.base_url}/-/dashboard") == 200
        browser.wait_for(f"{cell('held', 'queued_by_priority')}.includes('low 2')", 20)
        assert browser.evaluate(cell("held", "queued_by_priority")) == "high 0 · normal 0 · low 2"
        browser.wait_for(f"{cell('held', 'limited_tenants')}.includes('acme')", 20)
        assert browser.evaluate(cell("echo", "queued_by_priority")) == ""  # only where a request waits at high or low
        for store in ("store-1", "store-2"):
            client.call("stores", {"days": 1}, model_id=store)
        held = 'document.querySelector(\'tr[data-of="stores"] [data-field="models"]\')'
        browser.wait_for(f"{held} && {held}.textContent.includes('store-2')", 20)
        assert browser.evaluate(f"{held}.textContent") == "models: store-1, store-2"
