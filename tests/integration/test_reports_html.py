"""The HTML report and run book in a real browser: Debian's Chromium, headless, through
Playwright. Each opens from a file with no console error and no request leaving the file;
the report's timeline holds every step; the run book prints on A4 and US letter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import Page

from tests.peers.browser import Browser
from tests.peers.service import CLI
from tests.sites import EXAMPLES
from upsguard.config.loading import load_site
from upsguard.models import Direction
from upsguard.runbooks.planner import Planner

pytestmark = pytest.mark.browser

CLUSTER = EXAMPLES / "cluster.yaml"
LONG_OUTAGE = EXAMPLES / "scenarios" / "long-outage.yaml"
MM_PER_PX = 25.4 / 96


def upsguard(*args: str) -> int:
    """The CLI in a process of its own: Playwright's sync API keeps an event loop running in
    this one, and the CLI starts its own."""
    return subprocess.run([*CLI, *args], timeout=120).returncode


def rows(page: Page, selector: str) -> list[str]:
    found: list[str] = page.eval_on_selector_all(selector, "rows => rows.map(r => r.dataset.step)")
    return found


def test_the_report_of_a_dry_run_opens_offline_and_its_timeline_holds_every_step(
    tmp_path: Path, chromium: Browser
) -> None:
    report = tmp_path / "report.html"
    code = upsguard(
        "simulate", "-c", str(CLUSTER), "--scenario", str(LONG_OUTAGE), "--report", str(report)
    )
    assert code == 0

    page = chromium.open(report)
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)

    assert chromium.errors == []
    assert all(url.startswith("file://") for url in chromium.requests), chromium.requests
    plan = Planner(load_site(CLUSTER)).plan(Direction.SHUTDOWN)
    shutdown_table = "table.steps[data-run^='shutdown'] tr.step"
    assert rows(page, shutdown_table) == [s.id for s in plan.steps]
    chart = page.eval_on_selector_all(
        "#timeline ~ .chart svg", "charts => charts.map(c => c.textContent).join(' ')"
    )
    assert all(s.id in chart for s in plan.steps)
    assert page.locator("#timeline ~ table.steps tr.critical").count() > 0
    for section in ("battery", "caches", "phases", "findings", "outlook"):
        assert page.locator(f"#{section}").count() == 1
    assert "caches: dirty data draining" in page.content()
    assert (tmp_path / "report.png").stat().st_size > 0


def site_with_contacts(tmp_path: Path) -> Path:
    data = yaml.safe_load(CLUSTER.read_text())
    data["contacts"] = [
        {"name": "Ana", "role": "storage", "phone": "+1 555 0100", "email": "ana@example.org"}
    ]
    for res in data["resources"]:
        res["contact"] = "Ana"
    data["resources"][0]["manual"] = "ask Ana to stop it from the storage console"
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_run_book_prints_on_a4_and_letter_with_every_step(
    tmp_path: Path, chromium: Browser
) -> None:
    site_file = site_with_contacts(tmp_path)
    book = tmp_path / "runbook.html"
    assert upsguard("runbook", "-c", str(site_file), "-o", str(book)) == 0

    page = chromium.open(book)
    page.screenshot(path=str(tmp_path / "runbook.png"), full_page=True)

    assert chromium.errors == []
    site = load_site(site_file)
    planner = Planner(site)
    for direction in (Direction.SHUTDOWN, Direction.STARTUP):
        expected = [s.id for s in planner.plan(direction).steps]
        assert rows(page, f"#{direction.value}-steps tr.step") == expected
    text = page.inner_text("body")
    assert "Ana (+1 555 0100, ana@example.org)" in text
    assert "ask Ana to stop it from the storage console" in text
    assert "If upsguard itself is down" in text

    a4, letter = chromium.pdf_pages("A4"), chromium.pdf_pages("Letter")
    assert a4 >= 2 and letter >= 2  # the startup order begins on a page of its own
    assert letter >= a4  # letter is the shorter sheet

    # nothing runs off the paper: at the printable width of A4 (210 mm less the margins)
    page.set_viewport_size({"width": int((210 - 24) / MM_PER_PX), "height": 900})
    page.emulate_media(media="print")
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0
