"""Debian's Chromium, headless, driven by Playwright (TEST-PEERS.md: Playwright's own browser
download does not work here, so it is never asked for one).

Chromium runs with the flags that keep it from reaching out (background networking, updates,
sync): a report that opens with the power out must not need the network either.

Fixtures (registered in tests/conftest.py's ``pytest_plugins``):

* ``chromium_server`` (session): one Chromium per session (per xdist worker), started here
  with a profile of its own and the DevTools protocol on a port it picks itself
  (``--remote-debugging-port=0``, read back from ``DevToolsActivePort``).
* ``chromium`` (function): a ``Browser``: one page in a new browser context of that Chromium,
  closed after the test. A new context is the reset between tests: it starts with no cookies,
  storage, cache, permissions or pages of any test before it (what a fresh profile gave), and
  the browser process keeps nothing else a page can see.

Playwright itself starts per test and connects over CDP (``connect_over_cdp``): its sync API
marks this thread's event loop as running for as long as it lives, so one kept for the session
would break every later test of the worker that calls ``asyncio.run``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.peers.process import spawn, wait_started

if TYPE_CHECKING:  # playwright is imported when a test first asks for a browser
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Browser:
    """One page of a headless Chromium, with what its console said."""

    page: Page
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def open(self, path: Path) -> Page:
        self.page.goto(path.resolve().as_uri())
        return self.page

    def pdf_pages(self, paper: str) -> int:
        """Prints the page as a PDF on ``paper`` (A4, Letter) and counts its pages."""
        data = self.page.pdf(format=paper, print_background=True)
        return len(re.findall(rb"/Type\s*/Page\b", data))


@dataclass
class ChromiumServer:
    """The session's Chromium process and where its DevTools protocol listens."""

    proc: subprocess.Popen[bytes]
    profile: Path

    @property
    def endpoint(self) -> str:
        port = (self.profile / "DevToolsActivePort").read_text().splitlines()[0]
        return f"http://127.0.0.1:{port}"

    def listening(self) -> bool:
        active = self.profile / "DevToolsActivePort"
        return active.exists() and bool(active.read_text().strip())

    def stop(self) -> None:
        """Chromium's whole process group (renderers, zygote, GPU process), not just its wrapper."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="session")
def chromium_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromiumServer]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup --tests (installs chromium)")
    base = tmp_path_factory.mktemp("chromium")
    profile, log = base / "profile", base / "chromium.log"
    argv = [str(CHROMIUM), *ARGS, "--remote-debugging-port=0", f"--user-data-dir={profile}"]
    proc = spawn([*argv, "about:blank"], log, stdin=subprocess.DEVNULL, start_new_session=True)
    server = ChromiumServer(proc, profile)
    try:
        wait_started(proc, log, server.listening, "chromium", 60, pause=0.1)
        yield server
    finally:
        server.stop()


@pytest.fixture
def chromium(chromium_server: ChromiumServer) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(chromium_server.endpoint)
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        try:
            page = context.new_page()
            found = Browser(page)
            page.on("console", lambda m: found.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: found.errors.append(str(e)))
            page.on("request", lambda r: found.requests.append(r.url))
            yield found
        finally:
            context.close()
            browser.close()  # over CDP: disconnects, and Chromium goes on for the next test
