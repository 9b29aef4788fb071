"""What the power watch tells beside its decisions, as typed events: the status flags a person
must hear of, contact lost and back, a feed on battery with its outlook (when the shutdown
starts) and back on mains. Driven by the outage controller on a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from upsguard.clock import LoopClock, run_virtual
from upsguard.config.loading import validate
from upsguard.config.site import SiteConfig
from upsguard.config.source import parse_yaml
from upsguard.engine.destage import DestageWatch
from upsguard.engine.outage_controller import OutageController
from upsguard.errors import UpsUnreachable
from upsguard.events import (
    ContactBack,
    ContactLost,
    Event,
    EventBus,
    OnBattery,
    PowerRestored,
    UpsFlagChanged,
    describe,
    level,
)
from upsguard.models import PlatformName, UpsFlag, UpsName, UpsReading
from upsguard.plugins.platforms.simulated import SimulatedPlatform

E = TypeVar("E", bound=Event)
ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)

SITE = """
site: t
journal: /unused
ups: [{name: ups1, simulated: {}}]
platforms:
  sim: {type: simulated, guest_shutdown: 20s, host_shutdown: 60s}
resources:
  - {id: db, kind: vm, platform: sim, runs_on: [h1]}
  - {id: h1, kind: host, platform: sim}
policies:
  poll_interval: 5s
  on_battery: {after: 10s}
  power_returns: {online_for: 30s}
  shutdown: {when_any: [low_battery, "runtime < plan + 2m"]}
  critical_floor: {charge_below: 5, runtime_below: 30s}
"""


class ScriptedUps:
    """A UPS whose status words follow a script of the clock's seconds; on battery its
    runtime falls a second a second from 1500 s. ``lost``: upsd does not answer."""

    def __init__(self, clock: LoopClock, script: Callable[[float], str]) -> None:
        self.name = UpsName("ups1")
        self._clock = clock
        self._script = script

    async def read(self) -> UpsReading:
        t = self._clock.monotonic()
        words = self._script(t)
        if words == "lost":
            raise UpsUnreachable("ups1@127.0.0.1: connection refused")
        flags = frozenset(UpsFlag(w) for w in words.split())
        runtime = 1500.0 - t if UpsFlag.OB in flags else 3000.0
        return UpsReading(self.name, self._clock.now(), flags, 80.0, runtime)

    async def command(self, name: str) -> None:
        return None

    async def watch_for_changes(self, news: Callable[[], None]) -> None:
        return None

    async def close(self) -> None:
        return None


def drive(script: Callable[[float], str], until: float) -> tuple[list[Event], float]:
    """The events of a controller polling ``script`` every 5 s, and its plan's length."""
    events: list[Event] = []

    async def go() -> float:
        site = validate(SiteConfig, parse_yaml(SITE, "site.yaml"))
        clock = LoopClock(asyncio.get_running_loop(), ORIGIN)
        bus = EventBus()
        bus.subscribe(events.append)
        sim = site.platforms["sim"]
        loop = OutageController(
            site,
            sources={UpsName("ups1"): ScriptedUps(clock, script)},
            platforms={PlatformName("sim"): SimulatedPlatform(PlatformName("sim"), sim, clock)},  # type: ignore[arg-type]
            caches=DestageWatch(site, {}, clock, bus),
            clock=clock,
            events=bus,
        )
        plan = loop.plan_seconds()["ups1"].total_s
        while clock.monotonic() < until:
            await loop.tick()
            await asyncio.sleep(5)
        await loop.interrupt()
        return plan

    plan = run_virtual(go())
    return events, plan


def of(events: list[Event], kind: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, kind)]


def seconds(event: Event) -> float:
    return (event.at - ORIGIN).total_seconds()


def test_on_battery_tells_when_the_shutdown_starts_and_the_mains_return_how_long_it_took() -> None:
    events, plan = drive(lambda t: "OB DISCHRG" if 100 <= t < 400 else "OL", 500)
    (went,) = of(events, OnBattery)
    assert seconds(went) == 100 and went.outlook is not None
    told = went.outlook
    assert told.runtime_s == 1400 and not told.due_now
    assert told.condition == "runtime < plan + 2m" and told.metric == "runtime"
    assert told.limit == plan + 120 and told.fires_in_s == 1400 - (plan + 120)
    (back,) = of(events, PowerRestored)
    assert seconds(back) == 400 and back.outage_s == 300


def test_flags_are_told_once_when_raised_and_once_when_cleared() -> None:
    def script(t: float) -> str:
        if t < 50:
            return "OL"
        if t < 100:
            return "OL RB OVER"
        if t < 150:
            return "OL RB BYPASS"
        return "OL"

    events, _ = drive(script, 200)
    changes = [(seconds(e), e.flag, e.raised) for e in of(events, UpsFlagChanged)]
    assert changes == [
        (50, UpsFlag.RB, True),
        (50, UpsFlag.OVER, True),
        (100, UpsFlag.OVER, False),
        (100, UpsFlag.BYPASS, True),
        (150, UpsFlag.RB, False),
        (150, UpsFlag.BYPASS, False),
    ]
    raised = of(events, UpsFlagChanged)[0]
    assert describe(raised) == "WARNING: UPS ups1: battery needs replacing (RB)"
    assert level(raised) == "warning" and level(of(events, UpsFlagChanged)[-1]) == "info"


def test_low_battery_carries_the_outlook_of_its_feed_and_a_lost_ups_clears_no_flag() -> None:
    def script(t: float) -> str:
        if t < 100:
            return "OL RB"
        if t < 150:
            return "lost"  # unknown is no news: RB is not cleared by silence
        if t < 200:
            return "OB DISCHRG RB"
        return "OB DISCHRG LB RB"

    events, _ = drive(script, 230)
    changes = [(seconds(e), e.flag, e.raised) for e in of(events, UpsFlagChanged)]
    assert changes == [(0, UpsFlag.RB, True), (200, UpsFlag.LB, True)]
    low = of(events, UpsFlagChanged)[-1]
    assert low.outlook is not None and low.outlook.due_now
    assert low.outlook.condition == "low_battery"
    (lost,) = of(events, ContactLost)
    assert seconds(lost) >= 100 and "connection refused" in lost.why
    assert not lost.was_on_battery and not lost.stale
    (back,) = of(events, ContactBack)
    assert seconds(back) == 150
