"""The live web page in a real browser (Debian's Chromium, through Playwright) during a real
``upsguard run`` with a real upsd (dummy-ups) and vcsim.

Two operator tabs stay open from before the outage to the end, never reloaded: the
overview and the plan. The test drives the UPS on battery, then to low battery; the
shutdown's first step is a command that waits for the test, so the run is watched while
it is surely in progress. Every request the browser makes is routed through the test,
which refuses and counts any that would leave loopback.

Screenshots of each stage are kept beside the test's temporary files (and, with
``UPSGUARD_DOC_IMAGES=docs/images``, the overview is written there for the README).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.peers.browser import ARGS, CHROMIUM
from tests.peers.etcd import EtcdSite
from tests.peers.nut import NutServer
from tests.peers.ports import free_port
from tests.peers.service import ServiceProcess, write_site
from tests.peers.vcsim import Vcsim
from upsguard.config.ha import HaConfig
from upsguard.controller.web.auth import hash_password
from upsguard.plugins.coordination.base import ControllerView, UpsSeen
from upsguard.plugins.coordination.etcd import EtcdStore

pytestmark = [pytest.mark.nut, pytest.mark.vcsim, pytest.mark.browser, pytest.mark.timeout(300)]

ONLINE = "ups.status: OL\nbattery.charge: 100\nbattery.runtime: 2400\nups.load: 35\n"
ON_BATTERY = "ups.status: OB DISCHRG\nbattery.charge: 80\nbattery.runtime: 1500\nups.load: 35\n"
LOW_BATTERY = "ups.status: OB DISCHRG LB\nbattery.charge: 20\nbattery.runtime: 300\nups.load: 35\n"
DURATION = re.compile(r"^-?(\d+h )?(\d+m ?)?(\d+s)?$")
USERS = {"ana": ("operator", "ana's long passphrase"), "noc": ("viewer", "noc's passphrase")}
PLAN = ["stop:gate", "stop:sql01", "stop:dc01"]

RECORDER = """() => {
  window.seen = {phases: [], steps: {}};
  const note = () => {
    const render = Number(document.body.dataset.renders || 0);
    const phase = document.getElementById("phase").dataset.phase;
    const phases = window.seen.phases;
    if (phase && phases[phases.length - 1] !== phase) phases.push(phase);
    for (const row of document.querySelectorAll("table.plan tr[data-step]")) {
      const first = window.seen.steps[row.dataset.step] ||= {};
      if (!(row.dataset.state in first)) first[row.dataset.state] = render;
    }
  };
  const all = {subtree: true, childList: true, attributes: true};
  new MutationObserver(note).observe(document.body, all);
  note();
}"""


@dataclass
class Browsers:
    """Chromium with one context per user; every request checked, console errors kept."""

    base: str
    shots: Path
    playwright: Any
    browser: Any = None
    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def context(self) -> Any:
        context = self.browser.new_context(viewport={"width": 1200, "height": 900})
        context.route("**/*", self._route)
        return context

    def _route(self, route: Any) -> None:
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost") or route.request.url.startswith("data:"):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def page(self, context: Any, path: str) -> Any:
        page = context.new_page()
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.goto(self.base + path)
        return page

    def login(self, context: Any, name: str, path: str = "/") -> Any:
        page = self.page(context, path)
        page.fill("input[name=name]", name)
        page.fill("input[name=password]", USERS[name][1])
        page.click("button[type=submit]")
        page.wait_for_selector("#phase[data-phase]:not([data-phase=''])")
        return page

    def shot(self, page: Any, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def browsers(tmp_path: Path) -> Iterator[Browsers]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup --tests (installs chromium)")
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield Browsers("", shots, playwright, browser)
        finally:
            browser.close()


def web_site(
    tmp_path: Path, nut: NutServer, lab: Vcsim, **more: Any
) -> tuple[ServiceProcess, Path, int]:
    """``more``: sections of the site file to set or replace."""
    release = tmp_path / "release-gate"
    vm = {"kind": "vm", "platform": "vc", "guest_timeout": "60s"}
    port, metrics = free_port(), free_port()
    svc = write_site(
        tmp_path,
        {
            "site": "web-lab",
            "ups": [
                {"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}
            ],
            "platforms": {"vc": lab.settings_dict(tmp_path), "cmd": {"type": "command"}},
            "caches": [  # its host does not answer: read on battery, never shown as ok
                {
                    "name": "nas-ssd",
                    "provider": "command",
                    "targets": ["ssd0"],
                    "read_mode": "/nonexistent/cachetool mode {target}",
                    "set_write_through": "/nonexistent/cachetool wt {target}",
                    "set_write_back": "/nonexistent/cachetool wb {target}",
                    "read_dirty_bytes": "/nonexistent/cachetool dirty {target}",
                }
            ],
            "resources": [
                {"id": "dc01", **vm},
                {"id": "sql01", **vm, "depends_on": ["dc01"]},
                {
                    "id": "gate",  # stops first; ends once the test lets it
                    "kind": "command",
                    "platform": "cmd",
                    "shutdown": f"until [ -e '{release}' ]; do sleep 0.1; done",
                    "depends_on": ["sql01"],
                },
            ],
            "policies": {
                "poll_interval": "500ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery"]},
            },
            "service": {"metrics_port": metrics},
            "web": {
                "port": port,
                "users": [
                    {"name": n, "role": role, "password_hash": hash_password(pw)}
                    for n, (role, pw) in USERS.items()
                ],
            },
        }
        | more,
    )
    return svc, release, metrics


def until(page: Any, predicate: str, timeout: float = 30.0) -> None:
    """Wait until ``predicate`` (a JavaScript function) is true in the page. Playwright's own
    wait_for_function evaluates strings, which the page's CSP (no 'unsafe-eval') forbids."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(predicate):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {predicate}")
        page.wait_for_timeout(100)


def text(page: Any, selector: str) -> str:
    return str(page.inner_text(selector)).strip()


def post(context: Any, base: str, path: str, body: dict[str, Any], token: str | None) -> int:
    headers = {"Content-Type": "application/json", "Origin": base.rstrip("/")}
    if token is not None:
        headers["X-CSRF-Token"] = token
    response = context.request.post(base + path, headers=headers, data=json.dumps(body))
    return int(response.status)


def test_the_page_follows_a_real_outage_live_and_guards_its_controls(
    tmp_path: Path, nut_factory: Any, lab: Vcsim, browsers: Browsers
) -> None:
    nut: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    svc, release, metrics_port = web_site(tmp_path, nut, lab)
    svc.start()
    try:
        web = yaml_web(svc)
        browsers.base = f"http://127.0.0.1:{web['port']}"
        operator = browsers.context()
        overview = browsers.login(operator, "ana", "/")
        plan = browsers.page(operator, "/plan")
        until(plan, "() => document.querySelectorAll('table.plan tr[data-step]').length > 0")
        plan.evaluate(RECORDER)
        rows = plan.eval_on_selector_all(
            "#plan-shutdown tr[data-step]",
            "rows => rows.map(r => [r.dataset.step, r.dataset.state])",
        )
        assert rows == [[step, "waiting"] for step in PLAN]

        # a viewer reads but may not act; nobody acts without the CSRF token
        viewer = browsers.context()
        seen_by_viewer = browsers.login(viewer, "noc", "/")
        assert seen_by_viewer.locator("#controls").count() == 0
        viewer_token = seen_by_viewer.get_attribute('meta[name="csrf-token"]', "content")
        hold = {"reason": "test", "confirm": True}
        assert post(viewer, browsers.base, "/api/hold", hold, viewer_token) == 403
        assert post(operator, browsers.base, "/api/hold", hold, None) == 403
        assert svc.status()["held"] is None

        # an operator's hold, through the page's own dialog, holds the real service
        act(overview, "hold", "generator test on Friday")
        overview.wait_for_selector("#held:not([hidden])")
        held = svc.status()["held"]
        assert (held["who"], held["reason"]) == ("ana (web)", "generator test on Friday")
        history = svc.cli("history").stdout
        assert "hold by ana (web): generator test on Friday" in history
        act(overview, "release", "test over")
        overview.wait_for_selector("#held[hidden]", state="attached")

        # on battery: the runtime left beside the plan's time, the trigger that waits
        nut.write("ups1", ON_BATTERY)
        overview.wait_for_selector("#phase[data-phase=on_battery]")
        until(overview, "() => document.getElementById('runtime-left').textContent !== 'on mains'")
        assert DURATION.match(text(overview, "#runtime-left")), text(overview, "#runtime-left")
        assert DURATION.match(text(overview, "#plan-left")), text(overview, "#plan-left")
        assert "low_battery" in text(overview, "#triggers")
        browsers.shot(overview, "1-on-battery")
        caches = browsers.page(operator, "/caches")
        unread = "#caches tr[data-cache='nas-ssd/ssd0']"
        caches.wait_for_selector(f"{unread} .state[data-state=error]")
        assert "unread: " in text(caches, unread) and "clean" not in text(caches, unread)
        assert caches.locator(f"{unread} .state[data-state=ok]").count() == 0
        caches.close()

        # low battery: the shutdown starts and waits at the gate for the test
        nut.write("ups1", LOW_BATTERY)
        plan.wait_for_selector("#plan-shutdown tr[data-step='stop:gate'][data-state=running]")
        overview.wait_for_selector("#phase[data-phase=shutting_down]")
        overview.wait_for_selector("#run-summary")
        assert "stop:gate" in text(overview, "#run")
        assert DURATION.match(text(overview, "#plan-left")), text(overview, "#plan-left")
        assert svc.status()["countdown"]["plan_left_s"] > 0
        live = scrape_metrics(metrics_port)
        assert live["upsguard_web_sse_clients"] == 3.0  # two operator tabs and the viewer
        assert any(k.startswith('upsguard_web_requests_total{route="/api/hold"') for k in live)
        overview_shot = browsers.shot(overview, "2-shutting-down")
        browsers.shot(plan, "3-plan-running")
        release.touch()
        overview.wait_for_selector("#phase[data-phase=down]")
        plan.wait_for_selector("#plan-shutdown tr[data-step='stop:dc01'][data-state=done]")
        browsers.shot(plan, "4-plan-done")
        seen = plan.evaluate("window.seen")
        browsers.shot(seen_by_viewer, "5-viewer")
        look_back(browsers, operator, svc.status()["last_run"]["id"])
        operator.close()
        viewer.close()
    finally:
        svc.stop()

    journal = svc.read_journal()
    try:
        (run,) = journal.read.runs()
        phases = [p.new for p in reversed(journal.read.phases())]
    finally:
        journal.close()
    finished = [s.step for s in sorted(run.steps, key=lambda s: (s.ended or "", s.step))]
    assert sorted(finished) == sorted(PLAN) and run.state == "done"
    done_at = [seen["steps"][step]["done"] for step in finished]
    assert done_at == sorted(done_at), (finished, seen["steps"])  # the journal's order
    assert "running" in seen["steps"]["stop:gate"]
    assert seen["phases"] == ["normal", *phases]
    assert phases == ["on_battery", "shutting_down", "down"]
    assert browsers.outside == []
    assert browsers.errors == []
    target = os.environ.get("UPSGUARD_DOC_IMAGES")
    if target:
        shutil.copy(overview_shot, Path(target) / "web-overview.png")


def look_back(browsers: Browsers, context: Any, run: str) -> None:
    """After the outage: its events found by words, its run's report, its history charts."""
    events = browsers.page(context, "/events")
    events.fill("#filters input[name=q]", "ana (web)")
    until(
        events,
        "() => [...document.querySelectorAll('#events tbody tr')].length > 0 && "
        "[...document.querySelectorAll('#events tbody tr')]"
        ".every(r => r.textContent.includes('ana (web)'))",
    )
    assert "hold by ana (web): generator test on Friday" in text(events, "#events")
    browsers.shot(events, "6-events")
    runs = browsers.page(context, "/runs")
    runs.click(f"#runs tr[data-run='{run}'] a")
    runs.wait_for_selector("h1")
    assert run in text(runs, "h1")
    browsers.shot(runs, "7-report")
    history = browsers.page(context, "/history")
    until(
        history,
        "() => [...document.images].length === 3 && "
        "[...document.images].every(i => i.complete && i.naturalWidth > 0)",
    )
    browsers.shot(history, "8-history")


def yaml_web(svc: ServiceProcess) -> dict[str, Any]:
    import yaml

    web: dict[str, Any] = yaml.safe_load(svc.site.read_text())["web"]
    return web


def act(page: Any, action: str, reason: str) -> None:
    """One control through the page: the button, the dialog's reason and 'I am sure'."""
    page.click(f"#controls button[data-act={action}]")
    page.fill("#confirm-reason", reason)
    page.check("#confirm-sure")
    page.click("#confirm-go")
    page.wait_for_selector("#confirm", state="hidden")


def scrape_metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in lines
        if line and not line.startswith("#")
    }


@pytest.mark.etcd
def test_the_overview_shows_the_other_controllers_readings_beside_its_own(
    tmp_path: Path, nut_factory: Any, lab: Vcsim, browsers: Browsers, etcd: EtcdSite
) -> None:
    """A pair whose other controller (the test, publishing through the same etcd as a
    controller does) cannot read the UPS: the overview shows its reading, ``lost``, beside
    this controller's ``online``; before it publishes, and once it stopped, its row says so,
    and never shows a reading as ok."""
    nut: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    ha = {"name": "ctl-a", "endpoints": etcd.endpoints, "lease_ttl": "3s"}
    svc, _, _ = web_site(tmp_path, nut, lab, site=etcd.site, ha=ha)
    lost = UpsSeen("ups1", "lost", 97.0, 1800.0, why="cannot connect to upsd")
    svc.start()
    try:
        browsers.base = f"http://127.0.0.1:{yaml_web(svc)['port']}"
        page = browsers.login(browsers.context(), "noc", "/")
        rows = """() => [...document.querySelectorAll('#pair-readings tbody tr')]
            .map(r => [r.dataset.controller, r.querySelector('.state').textContent])"""
        until(page, f"() => ({rows})().some(r => r[0] === 'other')")
        assert ["ctl-a (this one)", "online"] in page.evaluate(rows)
        assert ["other", "unknown"] in page.evaluate(rows)

        view = ControllerView("ctl-b", "standby", datetime.now(UTC), (lost,))
        publish_once(etcd.site, HaConfig.model_validate({**ha, "name": "ctl-b"}), view)
        until(page, f"() => ({rows})().some(r => r[0] === 'ctl-b (standby)')")
        assert page.evaluate(rows) == [["ctl-a (this one)", "online"], ["ctl-b (standby)", "lost"]]
        assert "cannot connect to upsd" in text(page, "#pair-readings")

        until(page, f"() => ({rows})().some(r => r[0] === 'other')", timeout=60)
        assert page.evaluate(rows) == [["ctl-a (this one)", "online"], ["other", "unknown"]]
    finally:
        svc.stop()
    assert not browsers.errors


def publish_once(site: str, ha: HaConfig, view: ControllerView) -> None:
    """As a controller of the pair publishes its view, once, under a lease of the pair's TTL
    (on a thread of its own: Playwright's loop holds this one)."""

    async def once() -> None:
        store = EtcdStore(site, ha)
        try:
            await store.exchange_views(view, ha.lease_ttl.total_seconds())
        finally:
            await store.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, once()).result()
