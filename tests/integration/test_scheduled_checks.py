"""The service's scheduled checks and battery tests, against a real upsd.

The checks run on a fake clock: the schedule and the journal's times follow it, a day
passes between two checkups without waiting a day. The battery tests go through the real
upsd to the stand-in driver (``tests.peers.nut_driver``: dummy-ups offers no test command),
which plays the UPS on battery for the test's two seconds while the service's power watch
polls it: no feed goes at risk for it, and the result is journaled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.peers.nut import ON_LINE, NutServer
from tests.peers.nut_driver import DRIVER_COMMANDS
from tests.peers.webhook import WebhookServer
from tests.sites import site_from
from upsguard.cli import main
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.controller.service import Service
from upsguard.controller.web import doctor
from upsguard.controller.web.auth import User
from upsguard.controller.web.pages import render
from upsguard.events import (
    BatteryTestFinished,
    BatteryTestSkipped,
    CheckupDone,
    Event,
    Notice,
    OnBattery,
    PhaseChanged,
    UpsCommandSent,
)
from upsguard.findings import Verdict
from upsguard.journal import Journal
from upsguard.journal.checkups import battery_tests, last_checkup
from upsguard.journal.rows import iso
from upsguard.selftest import TestState as SelfTest  # not a class of tests for pytest to collect

pytestmark = [pytest.mark.nut, pytest.mark.timeout(120)]

ON_BATTERY = ON_LINE.replace("ups.status: OL", "ups.status: OB DISCHRG")


class FakeClock:
    """Wall time set by the test; the loop's clock for the monotonic seconds."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


def site_for(tmp_path: Path, nut: NutServer, **extra: Any) -> SiteConfig:
    ups = {
        "name": "ups1",
        "nut": {
            "host": "127.0.0.1",
            "port": nut.port,
            "ups": "smart",
            "user": "upsguard",
            "password_file": str(tmp_path / "nut.pw"),
            "monitor": "secondary",
        },
        "at_shutdown_end": {"command": "shutdown.return"},
    }
    if not (tmp_path / "nut.pw").exists():
        (tmp_path / "nut.pw").write_text("upsguard-secret\n")
        (tmp_path / "nut.pw").chmod(0o600)
    data: dict[str, Any] = {
        "site": "lab",
        "journal": str(tmp_path / "journal.sqlite"),
        "ups": [ups],
        "policies": {"poll_interval": "0.2s", "on_battery": {"after": "0.5s"}},
        "service": {"socket": str(tmp_path / "api.sock")},
    }
    for key, value in extra.items():
        if key == "ups":
            ups.update(value)
        else:
            data[key] = value
    return site_from(tmp_path, data)


def events_of(service: Service) -> list[Event]:
    seen: list[Event] = []
    service.bus.subscribe(seen.append)
    return seen


@pytest.fixture
def nut(nut_factory: Callable[..., NutServer]) -> NutServer:
    return nut_factory(
        {"smart": ON_LINE, "other": ON_LINE},
        ext="dev",
        fake_drivers={"smart": DRIVER_COMMANDS},
    )


def test_a_daily_checkup_is_journaled_and_notifies_what_broke(
    tmp_path: Path, nut: NutServer, webhook_server: WebhookServer
) -> None:
    site = site_for(
        tmp_path,
        nut,
        checks={"every": "1d", "timeout": "10s"},
        service={
            "socket": str(tmp_path / "api.sock"),
            "notify": {"webhook": {"url": webhook_server.url}},
        },
    )
    clock = FakeClock(datetime(2026, 11, 2, 9, 0, tzinfo=UTC))

    async def scenario() -> None:
        service = Service(site, clock)
        seen = events_of(service)
        try:
            await service.open(resume=False)
            job = service.calendar().get_job("checkup")
            assert job.trigger.interval == timedelta(days=1)
            assert job.trigger.start_date == clock.at + timedelta(minutes=1)
            clock.at += timedelta(minutes=1)
            await service.schedule.checkup()  # all well: journaled, nobody paged
            first = [e for e in seen if isinstance(e, CheckupDone)]
            assert [f.verdict for f in first[0].findings] == [Verdict.OK] * len(first[0].findings)
            assert first[0].broke == ()
            await service.notifier.drain()
            assert webhook_server.received == []

            # a day later the schedule counts from the journaled checkup; the password changed
            assert service.schedule.next_checkup() == clock.at + timedelta(days=1)
            (tmp_path / "nut.pw").write_text("an-old-password\n")
            clock.at += timedelta(days=1)
            await service.schedule.checkup()
            second = [e for e in seen if isinstance(e, CheckupDone)][1]
            assert [(f.subject, f.check, f.verdict) for f in second.broke] == [
                ("ups1", "login", Verdict.FAIL)
            ]
            await service.notifier.drain()
            (body,) = webhook_server.received
            assert body["event"] == "CheckupDone"
            assert [(b["subject"], b["check"], b["verdict"]) for b in body["broke"]] == [
                ("ups1", "login", "fail")
            ]
            assert "broke since the last checkup: ups ups1 login fail: upsd" in body["text"]
            panel = doctor_panel(service)  # the web page's doctor panel shows the same
            assert "failures found" in panel
            assert '<span class="state" data-state="failed">fail</span> ups ups1: login: ' in panel

            # mended the next day: journaled as such, not paged
            (tmp_path / "nut.pw").write_text("upsguard-secret\n")
            clock.at += timedelta(days=1)
            await service.schedule.checkup()
            third = [e for e in seen if isinstance(e, CheckupDone)][2]
            assert third.broke == () and [f.check for f in third.mended] == ["login"]
            await service.notifier.drain()
            assert len(webhook_server.received) == 1
            at, findings = last_checkup(service.journal.db) or (None, [])
            assert at == clock.at and {f.verdict for f in findings} == {Verdict.OK}
            (count,) = service.journal.db.execute("SELECT COUNT(*) FROM checkups").fetchone()
            assert count == 3
        finally:
            await service.close()

    asyncio.run(scenario())


def doctor_panel(service: Service) -> str:
    """The web page's doctor panel as the viewer ana would get it."""
    result = doctor.last_result(service.journal)
    viewer = User("ana", "viewer", "token")
    response = render(
        "doctor.html.j2",
        page="doctor",
        title="Doctor",
        site=service.site.site,
        user=viewer,
        result=result,
        states=doctor.STATE_OF,
    )
    assert response.text is not None
    return response.text


def _run_with_watch(site: SiteConfig, body: Callable[[Service], Any]) -> list[Event]:
    async def scenario() -> list[Event]:
        service = Service(site)
        seen = events_of(service)
        stop = asyncio.Event()
        try:
            await service.open(resume=False)
            watch = asyncio.create_task(service.watch_power(stop))
            try:
                await _ticks(service, watch, 3)  # the watch has read every UPS
                await body(service)
                await _ticks(service, watch, service.ticks + 3)  # and read them again after
            finally:
                stop.set()
                async with asyncio.timeout(30):
                    await watch
        finally:
            await service.close()
        return seen

    return asyncio.run(scenario())


async def _ticks(service: Service, watch: asyncio.Task[None], count: int) -> None:
    """Wait until the power watch has ticked ``count`` times; bounded, and failing at once
    with the watch's own error if it ended (a bound against a hang, never a measure)."""
    async with asyncio.timeout(30):
        while service.ticks < count:
            if watch.done():
                watch.result()
                pytest.fail(f"the power watch ended after {service.ticks} ticks")
            await asyncio.sleep(0.05)


async def _battery_test(service: Service) -> None:
    """What the calendar does at the test's time."""
    await service.schedule.battery_test(service.site.ups[0].name)


def test_a_battery_test_is_sent_to_the_ups_and_journaled_without_an_outage(
    tmp_path: Path, nut: NutServer
) -> None:
    test = {"every": "30d", "at": "Sun 03:00", "kind": "quick"}
    site = site_for(tmp_path, nut, ups={"battery_test": test})

    seen = _run_with_watch(site, _battery_test)
    assert nut.commands_received("smart") == ["test.battery.start.quick"]
    (finished,) = [e for e in seen if isinstance(e, BatteryTestFinished)]
    assert (finished.state, finished.text) == (SelfTest.PASSED, "Done and passed")
    assert not [e for e in seen if isinstance(e, OnBattery | PhaseChanged)]
    assert any(
        isinstance(e, Notice) and e.message.startswith("UPS ups1 self-test: on battery")
        for e in seen
    )
    journal = Journal(site.journal)
    try:
        (row,) = battery_tests(journal.db)
        assert (row.ups, row.kind, row.state, row.text) == (
            "ups1",
            "quick",
            SelfTest.PASSED,
            "Done and passed",
        )
        assert (iso(row.started), iso(row.ended)) == (iso(finished.started), iso(finished.at))
    finally:
        journal.close()


def test_a_deep_test_gives_the_runtime_it_observed(
    tmp_path: Path, nut: NutServer, capsys: pytest.CaptureFixture[str]
) -> None:
    test = {"every": "30d", "at": "03:00", "kind": "deep"}
    site = site_for(tmp_path, nut, ups={"battery_test": test})

    seen = _run_with_watch(site, _battery_test)
    (finished,) = [e for e in seen if isinstance(e, BatteryTestFinished)]
    assert finished.state is SelfTest.PASSED
    assert finished.charge_start == 100.0
    assert finished.charge_end is not None and finished.charge_end < 100.0
    assert finished.runtime_observed_s is not None and finished.runtime_observed_s > 0
    assert not [e for e in seen if isinstance(e, OnBattery | PhaseChanged)]
    site_file = tmp_path / "site.yaml"  # what site_for wrote
    assert main(["battery", "-c", str(site_file)]) == 0
    shown = capsys.readouterr().out.splitlines()
    (line,) = [line for line in shown if "ups1: deep test passed" in line]
    assert line.endswith(f"runtime observed {format_duration(finished.runtime_observed_s)}")


def test_no_battery_test_while_another_ups_is_on_battery(
    tmp_path: Path, nut_factory: Callable[..., NutServer]
) -> None:
    nut = nut_factory(
        {"smart": ON_LINE, "other": ON_BATTERY}, ext="dev", fake_drivers={"smart": DRIVER_COMMANDS}
    )
    test = {"every": "30d", "at": "Sun 03:00"}
    site = site_for(tmp_path, nut, ups={"battery_test": test})
    site = site.model_copy(
        update={
            "ups": [
                site.ups[0],
                nut.ups_config("other", site_name="ups2"),
            ],
            "feeds": [],
        }
    )

    seen = _run_with_watch(site, _battery_test)
    (skipped,) = [e for e in seen if isinstance(e, BatteryTestSkipped)]
    assert skipped.reason == "UPS ups2 is on battery"
    assert nut.commands_received("smart") == []
    assert not [e for e in seen if isinstance(e, BatteryTestFinished)]


def test_a_command_the_ups_does_not_offer_is_journaled_refused(
    tmp_path: Path, nut: NutServer
) -> None:
    """dummy-ups offers ``load.off`` alone: upsd refuses the test with CMD-NOT-SUPPORTED,
    and the journal keeps that answer as the command's typed result."""
    site = site_for(tmp_path, nut, ups={"battery_test": {"every": "30d", "at": "03:00"}})
    nut_entry = site.ups[0].nut
    assert nut_entry is not None
    other = nut_entry.model_copy(update={"ups": "other"})
    site = site.model_copy(update={"ups": [site.ups[0].model_copy(update={"nut": other})]})

    seen = _run_with_watch(site, _battery_test)
    (sent,) = [e for e in seen if isinstance(e, UpsCommandSent)]
    assert (sent.ups, sent.command, sent.ok) == ("ups1", "test.battery.start.quick", False)
    assert "CMD-NOT-SUPPORTED" in sent.detail
    journal = Journal(site.journal)
    try:
        (row,) = [e for e in journal.read.events(limit=1000) if e.kind == "UpsCommandSent"]
        assert row.payload is not None and row.level == "error"
        assert (row.payload["command"], row.payload["ok"]) == ("test.battery.start.quick", False)
        assert "CMD-NOT-SUPPORTED" in row.payload["detail"]
    finally:
        journal.close()
