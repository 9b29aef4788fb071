"""A reload of the site file (SIGHUP) builds everything anew, and what the service does on
its calendar afterwards acts through the new build, on the virtual clock.

Defects this reproduces (each failed before the fix): the service's schedule kept the
controller of the first site file, so after a reload the scheduled battery test was sent
through the UPS connection the reload had closed (NUT reopens one on its next use), and the
test was expected on the old controller's watch: the new one, the one that decides, read the
UPS on battery for the test as an outage. A test under way at the reload was stopped by it,
through the connection the reload had closed. And each reload added one more copy of every
figure to ``/metrics`` (a Prometheus scrape refuses a family listed twice).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from upsguard.clock import Clock, LoopClock, run_virtual
from upsguard.config.loading import load_site
from upsguard.config.site import SiteConfig
from upsguard.controller.service import Service
from upsguard.events import BatteryTestFinished, Event, OnBattery, PhaseChanged
from upsguard.models import UpsFlag, UpsName, UpsReading
from upsguard.plugins import catalog
from upsguard.plugins.registry import SitePlugins
from upsguard.selftest import TestResult as Result  # not classes of tests for pytest
from upsguard.selftest import TestState as SelfTest

ORIGIN = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
TEST_S = 20.0
"""How long the UPS stays on battery for its quick test."""


@dataclass
class Device:
    """The UPS itself, whatever connection reads it: on battery while a test runs."""

    clock: Clock
    testing_until: float | None = None
    result: Result = field(default_factory=lambda: Result(SelfTest.NONE, "No test initiated"))

    def testing(self) -> bool:
        return self.testing_until is not None and self.clock.monotonic() < self.testing_until


@dataclass
class Connection:
    """One source's connection to the device; like NUT's, a closed one opens again when
    used, and the test counts each use after its close."""

    name: UpsName
    device: Device
    closed: bool = False
    used_after_close: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def _use(self, what: str) -> None:
        if self.closed:
            self.used_after_close.append(what)

    async def read(self) -> UpsReading:
        self._use("read")
        testing = self.device.testing()
        flags = {UpsFlag.OB, UpsFlag.DISCHRG} if testing else {UpsFlag.OL}
        return UpsReading(
            ups=self.name,
            at=self.device.clock.now(),
            flags=frozenset(flags),
            charge_pct=100.0,
            runtime_s=3600.0,
            input_voltage=230.0,
        )

    async def command(self, name: str) -> None:
        self._use(name)
        self.commands.append(name)
        if name.startswith("test.battery.start"):
            self.device.testing_until = self.device.clock.monotonic() + TEST_S
            self.device.result = Result(SelfTest.RUNNING, "In progress")

    async def battery_test_result(self) -> Result:
        self._use("battery_test_result")
        if self.device.result.state is SelfTest.RUNNING and not self.device.testing():
            self.device.result = Result(SelfTest.PASSED, "Done and passed")
        return self.device.result

    async def watch_for_changes(self, changed: Callable[[], None]) -> None:
        return None

    async def close(self) -> None:
        self.closed = True


@dataclass
class World:
    device: Device
    connections: list[Connection] = field(default_factory=list)

    def plugins(self, site: SiteConfig, clock: Clock) -> SitePlugins:
        """What each build of the site file connects through: a new connection per UPS."""
        sources = {}
        for ups in site.ups:
            connection = Connection(ups.name, self.device)
            self.connections.append(connection)
            sources[ups.name] = connection
        return SitePlugins(sources=sources, platforms={}, caches={})  # type: ignore[arg-type]


def site_file(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    data = {
        "site": "reload",
        "journal": str(tmp_path / "journal.sqlite"),
        "service": {"socket": str(tmp_path / "api.sock")},
        "ups": [
            {
                "name": "ups1",
                "simulated": {},
                "battery_test": {"every": "30d", "at": "Sun 03:00", "kind": "quick"},
            }
        ],
        "resources": [{"id": "core-sw", "kind": "switch"}],
        "policies": {"poll_interval": "1s", "on_battery": {"after": "2s"}},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def watched(tmp_path: Path, story: Callable[[Service], Awaitable[None]]) -> ReloadRun:
    """Open the service on the virtual clock with its calendar, then tell ``story`` with
    the power watch polling all along, and the test's length after it."""
    path = site_file(tmp_path)

    async def scenario() -> ReloadRun:
        clock = LoopClock(asyncio.get_running_loop(), ORIGIN)
        world = World(Device(clock))
        site = load_site(path, catalog.names)
        service = Service(site, clock, plugins=world.plugins, site_path=path)
        seen: list[Event] = []
        service.bus.subscribe(seen.append)
        stop = asyncio.Event()
        try:
            await service.open(resume=False)
            service.calendar()  # the jobs, as serving adds them at start
            watch = asyncio.create_task(service.watch_power(stop))
            await story(service)
            await asyncio.sleep(TEST_S)
            stop.set()
            await watch
            current = service.controller.sources[UpsName("ups1")]
        finally:
            await service.close()
        return ReloadRun(world, seen, current)  # type: ignore[arg-type]

    return run_virtual(scenario())


@dataclass
class ReloadRun:
    world: World
    seen: list[Event]
    current: Connection


async def battery_test(service: Service) -> None:
    """What the calendar does at the test's time."""
    await service.schedule.battery_test(UpsName("ups1"))


async def reload_then_test(service: Service) -> None:
    await asyncio.sleep(3)
    await service.reload()  # what SIGHUP does
    await asyncio.sleep(3)
    await battery_test(service)


async def reload_during_the_test(service: Service) -> None:
    await asyncio.sleep(3)
    testing = asyncio.create_task(battery_test(service))
    await asyncio.sleep(TEST_S / 4)
    await service.reload()
    await testing


def test_a_battery_test_after_a_reload_goes_through_the_new_connection(tmp_path: Path) -> None:
    run = watched(tmp_path, reload_then_test)
    first, second = run.world.connections
    assert run.current is second
    assert first.used_after_close == []
    assert second.commands == ["test.battery.start.quick"]


def test_a_battery_test_after_a_reload_is_not_read_as_an_outage(tmp_path: Path) -> None:
    run = watched(tmp_path, reload_then_test)
    (finished,) = [e for e in run.seen if isinstance(e, BatteryTestFinished)]
    assert (finished.state, finished.text) == (SelfTest.PASSED, "Done and passed")
    said = [e for e in run.seen if isinstance(e, OnBattery | PhaseChanged)]
    assert said == []


def test_a_battery_test_under_way_at_a_reload_is_followed_by_the_new_build(
    tmp_path: Path,
) -> None:
    run = watched(tmp_path, reload_during_the_test)
    first, _ = run.world.connections
    assert first.commands == ["test.battery.start.quick"]
    assert first.used_after_close == []
    (finished,) = [e for e in run.seen if isinstance(e, BatteryTestFinished)]
    assert (finished.state, finished.text) == (SelfTest.PASSED, "Done and passed")
    said = [e for e in run.seen if isinstance(e, OnBattery | PhaseChanged)]
    assert said == []


async def reload_twice(service: Service) -> None:
    for _ in range(2):
        await asyncio.sleep(3)
        await service.reload()


def test_metrics_list_each_figure_once_after_reloads(tmp_path: Path) -> None:
    texts: list[str] = []

    async def story(service: Service) -> None:
        await reload_twice(service)
        texts.append(generate_latest(service.metrics.registry).decode())

    watched(tmp_path, story)
    (text,) = texts
    assert text.count("# TYPE upsguard_phase gauge") == 1
    assert text.count('upsguard_phase{phase="normal"} 1.0') == 1


def test_a_long_running_task_that_fails_ends_the_service_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin's bug at a reload killed the reload task: the service kept serving, deaf
    to every later SIGHUP, and the error came out only at stop (or never). Now the
    service ends (systemd starts it again, reading the site file afresh) and says why."""
    path = site_file(tmp_path)

    async def scenario() -> Service:
        clock = LoopClock(asyncio.get_running_loop(), ORIGIN)
        world = World(Device(clock))

        def plugins(site: SiteConfig, clock: Clock) -> SitePlugins:
            if world.connections:
                raise RuntimeError("a plugin's bug")
            return world.plugins(site, clock)

        service = Service(load_site(path, catalog.names), clock, plugins=plugins, site_path=path)
        stop = asyncio.Event()
        await service.open(resume=False)
        serving = asyncio.create_task(service.serve(stop))
        try:
            await asyncio.sleep(3)
            service.request_reload()  # what SIGHUP does
            async with asyncio.timeout(60):
                await asyncio.shield(serving)  # it ends by itself
        finally:
            stop.set()
            await serving
            await service.close()
        return service

    with caplog.at_level(logging.INFO):
        service = run_virtual(scenario())
    assert service.failed == "reload failed: RuntimeError: a plugin's bug"
    said = [r for r in caplog.records if "a plugin's bug" in r.getMessage()]
    assert [r.getMessage() for r in said] == [
        "ERROR: reload failed: RuntimeError: a plugin's bug: "
        "the service stops (systemd starts it again)"
    ]


def test_a_reload_gives_the_notifier_the_new_file_s_channels(tmp_path: Path) -> None:
    """The notify settings are the new file's after a reload, as everything else is."""
    names: list[list[str]] = []
    url = tmp_path / "mail.url"
    url.write_text("mailto://127.0.0.1:1?from=a@example.org&to=b@example.org\n")

    async def story(service: Service) -> None:
        names.append([c.name for c in service.notifier.channels.channels])
        path = site_file(tmp_path)  # the same file, with one Apprise channel added
        data = yaml.safe_load(path.read_text())
        data["service"]["notify"] = {"apprise": [{"name": "ops", "url_file": str(url)}]}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        await service.reload()
        names.append([c.name for c in service.notifier.channels.channels])

    watched(tmp_path, story)
    assert names == [[], ["ops"]]
