"""The outage controller as the service drives it, on a virtual clock: lost UPS data, holds,
manual runs and abort, and resuming a run from the journal after a crash."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest

from upsguard.clock import LoopClock, run_virtual
from upsguard.config.loading import validate
from upsguard.config.platforms import SimulatedPlatformSettings
from upsguard.config.site import SiteConfig
from upsguard.config.source import parse_yaml
from upsguard.engine.destage import DestageWatch
from upsguard.engine.outage_controller import OutageController
from upsguard.engine.pair import Pair
from upsguard.errors import UpsUnreachable
from upsguard.events import Event, EventBus, Notice, PhaseChanged, RunFinished, StepStarted
from upsguard.journal import Journal
from upsguard.journal.resume import reap_and_resume
from upsguard.models import (
    Direction,
    Phase,
    PlatformName,
    PowerState,
    ResourceKind,
    Target,
    UpsFlag,
    UpsName,
    UpsReading,
)
from upsguard.plugins.platforms.simulated import SimulatedPlatform

E = TypeVar("E", bound=Event)

SITE = """
site: t
journal: /unused
ups: [{name: ups1, simulated: {}}]
platforms:
  sim: {type: simulated, guest_shutdown: 20s, host_shutdown: 60s, power_on: 10s, host_power_on: 30s}
resources:
  - {id: app, kind: vm, platform: sim, runs_on: [h1], depends_on: [db]}
  - {id: db, kind: vm, platform: sim, runs_on: [h1]}
  - {id: h1, kind: host, platform: sim}
policies:
  poll_interval: 5s
  on_battery: {after: 10s}
  shutdown: {when_any: [low_battery, "runtime < plan + 2m"]}
  critical_floor: {charge_below: 10, runtime_below: 90s}
"""


def site() -> SiteConfig:
    return validate(SiteConfig, parse_yaml(SITE, "site.yaml"))


class ScriptedUps:
    """A UPS source following a script of (from_second, reading or error) entries.

    Test double for the layers above the plugins: the values mimic what NUT's
    upsd reports for a UPS on battery (``OB DISCHRG``, ``battery.runtime``,
    ``battery.charge``); the error is the one the NUT source raises when upsd
    goes away. Runtime and charge fall by one unit a second while on battery.
    """

    def __init__(self, clock: LoopClock, script: Callable[[float], str]) -> None:
        self.name = UpsName("ups1")
        self._clock = clock
        self._script = script

    async def read(self) -> UpsReading:
        t = self._clock.monotonic()
        state = self._script(t)
        if state == "lost":
            raise UpsUnreachable("ups1@127.0.0.1: connection refused")
        if state == "OL":
            return UpsReading(self.name, self._clock.now(), frozenset({UpsFlag.OL}), 100.0, 900.0)
        if state == "OL, no charge":  # a driver without battery.charge (genericups)
            return UpsReading(self.name, self._clock.now(), frozenset({UpsFlag.OL}), None, None)
        if state == "CAL":  # a battery test: on battery on purpose, mains present
            flags = frozenset({UpsFlag.OB, UpsFlag.CAL})
            return UpsReading(self.name, self._clock.now(), flags, 99.0, 900.0, input_voltage=230)
        return UpsReading(
            self.name,
            self._clock.now(),
            frozenset({UpsFlag.OB, UpsFlag.DISCHRG}),
            max(0.0, 90.0 - t / 20),
            max(0.0, 900.0 - t),
        )

    async def command(self, name: str) -> None:
        return None

    async def watch_for_changes(self, news: Callable[[], None]) -> None:
        return None  # no push channel, as a source without traps

    async def close(self) -> None:
        return None


class Harness:
    def __init__(self, script: Callable[[float], str], journal: Journal | None = None) -> None:
        self.script = script
        self.journal = journal
        self.events: list[Event] = []
        self.platform: SimulatedPlatform | None = None

    def build(self, pair: Pair | None = None) -> OutageController:
        """``pair``: this controller's side of a pair (a stand-in will do)."""
        s = site()
        if not hasattr(self, "clock"):  # the real world's clock outlives a controller
            self.clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        bus = self.bus = EventBus()
        bus.subscribe(self.events.append)
        if self.journal is not None:
            bus.subscribe(self.journal.write.record)
        settings = s.platforms["sim"]
        assert isinstance(settings, SimulatedPlatformSettings)
        if self.platform is None:  # the real world outlives a controller
            self.platform = SimulatedPlatform(PlatformName("sim"), settings, self.clock)
        return OutageController(
            s,
            sources={UpsName("ups1"): ScriptedUps(self.clock, self.script)},
            platforms={PlatformName("sim"): self.platform},
            caches=DestageWatch(s, {}, self.clock, bus),
            clock=self.clock,
            events=bus,
            pair=pair,
        )

    async def drive(self, loop: OutageController, until: float) -> None:
        while self.clock.monotonic() < until:
            await loop.tick()
            await asyncio.sleep(5)

    def kinds(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


def test_ups_lost_on_battery_keeps_counting_down_and_shuts_down() -> None:
    h = Harness(lambda t: "OB" if t < 60 else "lost")

    async def go() -> OutageController:
        loop = h.build()
        await h.drive(loop, 1200)
        await loop.interrupt()
        return loop

    loop = run_virtual(go())
    # last known runtime 840 s at t=60; the plan takes 80 s: runtime < 200 s near t=700
    started = [e for e in h.kinds(PhaseChanged) if e.new is Phase.SHUTTING_DOWN]
    assert len(started) == 1
    figures = started[0].figures
    assert figures is not None and figures.condition == "runtime < plan + 2m"
    assert started[0].reason == f"runtime < plan + 2m: {figures.figures()}"
    at = (started[0].at - datetime(2026, 1, 1, tzinfo=UTC)).total_seconds()
    assert 600 < at < 760
    assert Phase.RECOVERING not in [e.new for e in h.kinds(PhaseChanged)]
    assert loop.engine.phase is Phase.DOWN
    finished = h.kinds(RunFinished)
    assert [(e.spec.kind, e.outcome) for e in finished] == [("shutdown", "done")]


def test_a_hold_defers_the_shutdown_down_to_the_critical_floor() -> None:
    h = Harness(lambda t: "OB")

    async def go() -> OutageController:
        loop = h.build()
        loop.engine.hold("generator starting")
        await h.drive(loop, 900)
        await loop.interrupt()
        return loop

    run_virtual(go())
    started = [e for e in h.kinds(PhaseChanged) if e.new is Phase.SHUTTING_DOWN]
    assert len(started) == 1
    assert started[0].reason.startswith("critical floor reached during a hold (generator starting)")
    at = (started[0].at - datetime(2026, 1, 1, tzinfo=UTC)).total_seconds()
    assert at >= 900 - 90  # runtime under 90 s: the floor


def test_manual_shutdown_under_mains_is_not_cancelled_and_abort_holds_the_site() -> None:
    h = Harness(lambda t: "OL")

    async def go() -> tuple[OutageController, str | None]:
        loop = h.build()
        await h.drive(loop, 60)  # on line for a minute: power "is back" already
        await loop.trigger(Direction.SHUTDOWN, None, "maintenance")
        await h.drive(loop, 70)
        assert loop.busy and loop.engine.phase is Phase.SHUTTING_DOWN
        aborted = await loop.abort()
        loop.engine.hold("aborted")  # what 'upsguard abort' does with it
        await h.drive(loop, 1000)
        assert [e.outcome for e in h.kinds(RunFinished)] == ["aborted"]
        loop.engine.release()  # the policy restarts what was stopped
        await h.drive(loop, 1200)
        await loop.interrupt()
        return loop, aborted

    _, aborted = run_virtual(go())
    assert aborted is not None and aborted.startswith("shutdown-")
    moves = [(e.old, e.new, e.reason) for e in h.kinds(PhaseChanged)]
    assert moves[0] == (Phase.NORMAL, Phase.SHUTTING_DOWN, "manual shutdown: maintenance")
    assert moves[1] == (Phase.SHUTTING_DOWN, Phase.RECOVERING, "shutdown aborted")
    assert [(e.spec.kind, e.outcome) for e in h.kinds(RunFinished)] == [
        ("shutdown", "aborted"),
        ("startup", "done"),
    ]


def test_a_manual_shutdown_stays_down_until_a_person_starts_the_site() -> None:
    h = Harness(lambda t: "OL")

    async def go() -> OutageController:
        loop = h.build()
        await h.drive(loop, 10)
        await loop.trigger(Direction.SHUTDOWN, None, "maintenance")
        await h.drive(loop, 3600)  # an hour on mains: no automatic startup
        assert loop.engine.phase is Phase.DOWN
        await loop.trigger(Direction.STARTUP, None, "maintenance over")
        await h.drive(loop, 3600 + 200)
        await loop.interrupt()
        return loop

    loop = run_virtual(go())
    assert [(e.spec.kind, e.outcome) for e in h.kinds(RunFinished)] == [
        ("shutdown", "done"),
        ("startup", "done"),
    ]
    assert h.platform is not None
    assert loop.engine.phase in (Phase.RECOVERING, Phase.NORMAL)


def test_a_run_cut_short_by_a_crash_is_resumed_without_repeating_done_steps(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    h = Harness(lambda t: "OL", journal)

    async def go() -> None:
        first = h.build()
        await h.drive(first, 10)
        run = await first.trigger(Direction.SHUTDOWN, None, "maintenance")
        await asyncio.sleep(25)  # app is down, db's shutdown is under way
        await first.interrupt()  # what SIGTERM does; kill -9 leaves 'running' rows, same result
        h.events.clear()
        second = h.build()
        resumed = await reap_and_resume(journal, second, h.clock, h.bus)
        assert resumed == run
        assert second.engine.phase is Phase.SHUTTING_DOWN
        await h.drive(second, 400)
        await second.interrupt()

    run_virtual(go())
    started = [e.step for e in h.kinds(StepStarted)]
    assert "stop:app" not in started  # done before the crash: not run again
    assert started == ["stop:db", "stop:h1"]
    assert [(e.spec.kind, e.outcome) for e in h.kinds(RunFinished)] == [("shutdown", "done")]
    (run,) = journal.read.runs()
    assert (run.state, run.resumed) == ("done", 1)
    assert [(s.step, s.attempt, s.state) for s in run.steps] == [
        ("stop:app", 1, "done"),
        ("stop:db", 1, "interrupted"),
        ("stop:db", 2, "done"),
        ("stop:h1", 1, "done"),
    ]
    assert h.platform is not None
    state = run_virtual(h.platform.power_state(_target(h.platform, "h1")))
    assert state is PowerState.OFF
    journal.close()


def test_a_poll_under_way_when_the_service_stops_starts_no_run_after_it(tmp_path: Path) -> None:
    """SIGTERM while the power watch was reading the UPSes: the service interrupted the run,
    then the poll ended and found the phase shutting down with no run carrying it. It began
    a new one, which the restart resumed, closing the interrupted one as superseded: two runs
    for one outage, the first one's steps left behind (a full lane in CI, test_ssh_resume)."""
    journal = Journal(tmp_path / "j.sqlite")
    h = Harness(lambda t: "OB", journal)

    async def go() -> None:
        first = h.build()
        await h.drive(first, 720)  # the runtime trigger held near t=700
        assert first.busy and first.executor is not None
        run = first.executor.spec.id
        await first.interrupt()  # what SIGTERM does
        await first.tick()  # the poll that was under way
        assert not first.busy
        second = h.build()
        assert await reap_and_resume(journal, second, h.clock, h.bus) == run
        await h.drive(second, 1100)
        await second.interrupt()

    run_virtual(go())
    runs = [(r.kind, r.state, r.resumed) for r in journal.read.runs()]
    journal.close()
    assert runs == [("shutdown", "done", 1)]


@pytest.mark.parametrize("restart_at", [720, 1100], ids=["mid-shutdown", "down"])
def test_a_restart_that_cannot_read_the_ups_never_takes_the_mains_for_back(
    tmp_path: Path, restart_at: float
) -> None:
    """The UPS is read through a NUT server the shutdown stopped; the service restarts and
    cannot read it. A UPS never read counts as no outage (it does not start a shutdown), but
    it is no sign of the mains either: the shutdown goes on (or the site stays down), never
    cancelled and never started again on a battery still draining."""
    journal = Journal(tmp_path / "j.sqlite")
    h = Harness(lambda t: "OB" if t < restart_at else "lost", journal)

    async def go() -> None:
        first = h.build()
        await h.drive(first, restart_at)
        await first.interrupt()
        second = h.build()
        await reap_and_resume(journal, second, h.clock, h.bus)
        await h.drive(second, restart_at + 3600)
        await second.interrupt()

    run_virtual(go())
    runs = [(r.kind, r.state) for r in journal.read.runs()]
    journal.close()
    assert Phase.RECOVERING not in [e.new for e in h.kinds(PhaseChanged)]
    assert runs == [("shutdown", "done")]


def test_the_startup_waits_for_a_charge_it_can_read() -> None:
    """After the shutdown the mains are back, but the UPS reports no charge: the startup's
    ``charge_above`` cannot be judged, and the site is not started on a battery that may be
    empty (a person starts it, or the site file sets charge_above: 0)."""
    h = Harness(lambda t: "OB" if t < 800 else "OL, no charge")

    async def go() -> None:
        loop = h.build()
        await h.drive(loop, 3000)
        await loop.interrupt()

    run_virtual(go())
    kinds = [(e.spec.kind, e.outcome) for e in h.kinds(RunFinished)]
    assert kinds == [("shutdown", "done")]
    assert [e.new for e in h.kinds(PhaseChanged)][-1] is Phase.RECOVERING


def _target(platform: SimulatedPlatform, name: str) -> Target:
    return Target(platform.name, ResourceKind.HOST, name)


def test_the_startup_policys_online_timer_survives_a_restart(tmp_path: Path) -> None:
    """Mains back at t=100; the service restarts 5 minutes later; the site is recovered
    10 minutes after the mains came back (startup.online_for), not 10 after the restart."""
    journal = Journal(tmp_path / "j.sqlite")
    h = Harness(lambda t: "OB" if t < 100 else "OL", journal)

    async def go() -> None:
        first = h.build()
        await h.drive(first, 400)
        await first.interrupt()
        second = h.build()
        await reap_and_resume(journal, second, h.clock, h.bus)
        await h.drive(second, 1200)
        await second.interrupt()

    run_virtual(go())
    journal.close()
    back = [e for e in h.kinds(PhaseChanged) if e.new is Phase.NORMAL]
    at = (back[0].at - datetime(2026, 1, 1, tzinfo=UTC)).total_seconds()
    assert 700 <= at < 720  # 100 s + 10 min, at the next poll


def test_a_self_test_is_one_event_and_no_outage() -> None:
    h = Harness(lambda t: "CAL" if 20 <= t < 30 else "OL")

    async def go() -> None:
        loop = h.build()
        await h.drive(loop, 60)
        await loop.interrupt()

    run_virtual(go())
    notes = [e.message for e in h.kinds(Notice)]
    assert notes == ["UPS ups1 self-test: on battery 10s, ignored"]
    assert h.kinds(PhaseChanged) == []
