"""Debian's Chromium, headless, driven by Playwright (TEST-PEERS.md: Playwright's own browser
download does not work here, so it is never asked for one).

Each test gets a fresh profile under its own temporary directory and the flags that keep
Chromium from reaching out (background networking, updates, sync): a report that opens
with the power out must not need the network either.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

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

    page: object
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def open(self, path: Path) -> object:
        self.page.goto(path.resolve().as_uri())  # type: ignore[attr-defined]
        return self.page

    def pdf_pages(self, paper: str) -> int:
        """Prints the page as a PDF on ``paper`` (A4, Letter) and counts its pages."""
        data: bytes = self.page.pdf(format=paper, print_background=True)  # type: ignore[attr-defined]
        return len(re.findall(rb"/Type\s*/Page\b", data))


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup --tests (installs chromium)")
    from playwright.sync_api import sync_playwright

    profile = tmp_path / "chromium-profile"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1200, "height": 900},
        )
        try:
            page = context.new_page()
            browser = Browser(page)
            page.on(
                "console", lambda m: browser.errors.append(m.text) if m.type == "error" else None
            )
            page.on("pageerror", lambda e: browser.errors.append(str(e)))
            page.on("request", lambda r: browser.requests.append(r.url))
            yield browser
        finally:
            context.close()
