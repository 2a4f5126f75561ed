"""The headless-browser driver keeps its promises: it opens a page, waits for what the page's JavaScript does,
evaluates, takes a real screenshot, and leaves no chromium process and no profile behind, however the block ends."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.e2e.browser import CHROMIUM, VIEWPORT, Browser, group_exists

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"),
]

# Says "loading" until its script has waited 300 ms, then "ready".
PAGE = b"""<!doctype html>
<html><head><title>driver test</title></head>
<body style="background: #d0e8ff">
  <h1>Browser driver</h1>
  <p id="state">loading</p>
  <script>setTimeout(() => { document.getElementById("state").textContent = "ready"; }, 300);</script>
</body></html>
"""


class PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def page_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), PageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def assert_left_nothing(browser: Browser) -> None:
    assert browser.process_groups, "the browser's processes were never found"
    assert [pgid for pgid in browser.process_groups if group_exists(pgid)] == []
    assert browser.profile_dir is not None and not browser.profile_dir.exists()


def test_opens_waits_evaluates_and_screenshots(page_url: str, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    with Browser() as browser:
        assert browser.open(page_url) == 200
        browser.wait_for("document.getElementById('state').textContent === 'ready'", timeout_s=10)
        seen = browser.evaluate("({title: document.title, state: document.getElementById('state').textContent})")
        assert seen == {"title": "driver test", "state": "ready"}
        assert browser.evaluate("new Promise(resolve => setTimeout(() => resolve(6 * 7), 10))") == 42
        browser.screenshot(shot)
    assert_left_nothing(browser)

    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert struct.unpack(">II", png[16:24]) == (VIEWPORT["width"], VIEWPORT["height"])  # IHDR: width, height
    assert 2_000 < len(png) < 5_000_000


def test_wait_for_times_out_with_the_page_text_and_still_stops_chromium(page_url: str) -> None:
    with pytest.raises(TimeoutError) as failed, Browser() as browser:
        browser.open(page_url)
        started = time.monotonic()
        try:
            browser.wait_for("document.getElementById('state').textContent === 'never'", timeout_s=1)
        finally:
            waited = time.monotonic() - started
    assert 1 <= waited < 5
    message = str(failed.value)
    assert "'never'" in message and page_url in message
    assert "Browser driver" in message  # the text the page shows
    assert_left_nothing(browser)
