"""Headless Chromium for the end-to-end tests: open a page, evaluate JavaScript, take a screenshot.

Playwright drives the system's chromium (``CHROMIUM``); it never downloads a browser of its own, so
``playwright install`` is not needed. The API is synchronous (Playwright's sync API), so call it from plain
test functions, not from inside a running asyncio loop.

Chromium does not stay in one process group: its crash handlers start their own sessions. Every process it
starts carries the farm's marker in its environment (tests/harness/farm.py), so ``Browser`` finds them all, and
on exit it stops each of their process groups, by id, and waits until they are gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from playwright.sync_api import BrowserContext, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.harness.farm import marked_env, pids_with_marker
from tests.harness.waiting import wait_for

# The browser the tests drive, or None where there is none (the tests then skip).
CHROMIUM: str | None = shutil.which("chromium") or shutil.which("chromium-browser")
VIEWPORT = {"width": 1280, "height": 900}
# The text of the page that a failed wait_for shows.
BODY_TEXT = "document.body ? document.body.innerText.slice(0, 2000) : '(no body)'"


def group_exists(pgid: int) -> bool:
    """Whether any process, a zombie not yet reaped included, is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def close_quietly(context: BrowserContext) -> None:
    """Close gracefully; a browser that died already has nothing left to close (its processes are killed next)."""
    with contextlib.suppress(PlaywrightError):
        context.close()


class Browser:
    """One headless Chromium with one page, for the length of a ``with`` block.

    ``process_groups`` are the process groups of every process the browser started; none is left once the
    block ends, however it ends, and neither is the temporary profile (``profile_dir``).
    """

    def __init__(self, executable: str | None = None, launch_timeout_s: float = 30.0) -> None:
        self.executable = executable or CHROMIUM
        self.launch_timeout_s = launch_timeout_s
        self.token = uuid.uuid4().hex
        self.process_groups: set[int] = set()
        self.profile_dir: Path | None = None
        self._playwright: Playwright | None = None
        self._context: BrowserContext | None = None
        self._page: Page | None = None

    def __enter__(self) -> Browser:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        if self.executable is None:
            raise RuntimeError("no chromium on this machine (looked for chromium and chromium-browser on PATH)")
        self.profile_dir = Path(tempfile.mkdtemp(prefix="sstest-chromium-"))
        env: dict[str, str | float | bool] = {**marked_env(self.token, {})}
        self._playwright = sync_playwright().start()
        self._context = self._playwright.chromium.launch_persistent_context(
            self.profile_dir,
            executable_path=self.executable,
            headless=True,
            args=["--disable-gpu"],
            env=env,
            viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]},
            timeout=self.launch_timeout_s * 1000,
        )
        self._note_process_groups()
        self._page = self._context.pages[0] if self._context.pages else self._context.new_page()

    @property
    def page(self) -> Page:
        """Playwright's page, for what this class does not wrap."""
        if self._page is None:
            raise RuntimeError("the browser is not running: use it inside `with Browser() as browser:`")
        return self._page

    def open(self, url: str, timeout_s: float = 30.0) -> int | None:
        """Go to ``url`` and wait for its load event; the HTTP status of the response (None for about:, data:)."""
        response = self.page.goto(url, wait_until="load", timeout=timeout_s * 1000)
        return None if response is None else response.status

    def evaluate(self, js: str) -> object:
        """The JSON-able value of the JavaScript expression ``js`` (a promise is awaited)."""
        return self.page.evaluate(js)

    def wait_for(self, js: str, timeout_s: float = 10.0) -> None:
        """Poll every 100 ms until the JavaScript expression ``js`` is truthy; TimeoutError, with the text the
        page shows, if it is not within ``timeout_s``."""
        try:
            self.page.wait_for_function(js, polling=100, timeout=timeout_s * 1000)
        except PlaywrightTimeout:
            text = self.page.evaluate(BODY_TEXT)
            raise TimeoutError(
                f"{js!r} was not true within {timeout_s} s on {self.page.url}; the page shows:\n{text}"
            ) from None

    def screenshot(self, path: str | Path) -> None:
        """Write what the viewport shows to ``path``, as a PNG."""
        self.page.screenshot(path=path, type="png")

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the browser, stop Playwright's driver, kill whatever of the browser is left, by process group, and
        remove its profile: each step runs even when one before it fails or is interrupted."""
        self._note_process_groups()
        context, playwright = self._context, self._playwright
        self._context = self._page = self._playwright = None
        with contextlib.ExitStack() as steps:  # runs its callbacks last first
            if self.profile_dir is not None:
                steps.callback(shutil.rmtree, self.profile_dir, ignore_errors=True)
            steps.callback(self._stop_process_groups, timeout_s)
            if playwright is not None:
                steps.callback(playwright.stop)
            if context is not None:
                steps.callback(close_quietly, context)

    def _note_process_groups(self) -> None:
        for pid in pids_with_marker(self.token):
            with contextlib.suppress(ProcessLookupError):
                self.process_groups.add(os.getpgid(pid))

    def _stop_process_groups(self, timeout_s: float) -> None:
        """Give the processes a moment to leave after a graceful close, SIGKILL the groups of those that did not,
        and wait until every group is gone (init reaps the ones whose parent went first)."""
        self._note_process_groups()
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(AssertionError):  # a moment to leave by themselves; the rest are killed below
            wait_for(lambda: not pids_with_marker(self.token), 2.0, interval_s=0.05)
        self._note_process_groups()
        for pgid in self.process_groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        remaining = max(0.0, deadline - time.monotonic())

        def still_there() -> str:
            alive = sorted(pgid for pgid in self.process_groups if group_exists(pgid))
            return f"chromium's process groups {alive} are still there {timeout_s} s after closing it"

        wait_for(lambda: not any(map(group_exists, self.process_groups)), remaining, still_there, interval_s=0.05)
