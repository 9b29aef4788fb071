"""``upsguard simulate``: the whole outage on a virtual clock, with simulated plugins.

The same outage loop, phase engine, planner, executor and destage watch as
the service run here; only the plugins are simulated and the clock is
virtual, so a day-long scenario takes well under a second and never sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import NamedTuple

from upsguard.clock import LoopClock, run_virtual
from upsguard.config.caches import SimulatedCacheSettings
from upsguard.config.platforms import SimulatedPlatformSettings
from upsguard.config.scenario import Scenario
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.engine.destage import DestageWatch
from upsguard.engine.outage_controller import OutageController
from upsguard.events import (
    Event,
    PhaseChanged,
    PointOfNoReturn,
    RiskAccepted,
    RunFinished,
    RunStarted,
    StepFinished,
    describe,
)
from upsguard.models import (
    CacheName,
    Direction,
    Phase,
    PlatformName,
    PowerState,
    ResourceId,
    StepState,
    UpsName,
)
from upsguard.plugins.caches.base import CacheProvider
from upsguard.plugins.caches.simulated import SimulatedCache
from upsguard.plugins.platforms.simulated import Fleet, Hang, SimulatedPlatform
from upsguard.plugins.registry import used_platform_names
from upsguard.plugins.ups.base import UpsSource
from upsguard.plugins.ups.simulated import SimulatedUps
from upsguard.reports.story import CacheSample
from upsguard.runbooks.planner import Planner
from upsguard.runbooks.schedule import after_point_of_no_return
from upsguard.runs import RunKind, RunOutcome
from upsguard.simulation import script
from upsguard.simulation.behaviour import planned_behaviour
from upsguard.simulation.own_machine import ControllerMachine, Unguarded
from upsguard.simulation.verdict import EndOfShutdown, ShutdownWatch, describe_end
from upsguard.simulation.world import PowerWorld
from upsguard.units import format_names

ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


class Moment(NamedTuple):
    at_s: float
    text: str
    kind: str
    battery: dict[UpsName, tuple[float, float]]  # charge %, runtime s


@dataclass
class SimulationReport:
    scenario: str
    timeline: list[Moment] = field(default_factory=list)
    verdict: str = ""
    ok: bool = False
    margin_s: float | None = None
    required_margin_s: float = 0.0
    ran_out_at_s: float | None = None
    ran_out_during: list[str] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    shutdown_finished_at_s: float | None = None
    end_of_shutdown: EndOfShutdown | None = None
    """The battery at the end of the shutdown with the least margin."""
    lost_power: list[str] = field(default_factory=list)
    """Protected resources that lost power while still on."""
    plan_estimate_s: float = 0.0
    plan_critical_path_s: float = 0.0
    end_s: float = 0.0
    final_phase: str = Phase.NORMAL.value
    cache_samples: list[CacheSample] = field(default_factory=list)
    """Each cache's dirty data while the caches drain (the drain curves of a retrospective)."""
    back_at_s: float | None = None
    """When the site was back to normal after a shutdown."""
    stays_down: str | None = None
    """Why the site does not come back (upsguard's machine off, and nothing powers it on)."""
    unguarded: list[Unguarded] = field(default_factory=list)
    """Hardware left running while upsguard's machine was off."""
    needless: bool = False
    """The mains returned before anything past the guests had to stop
    (``EndOfShutdown.needless``): said in the verdict, not a failure."""

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def simulate(
    site: SiteConfig, scenario: Scenario, planner: Planner | None = None
) -> SimulationReport:
    """``planner``: the site's, when the caller has made it already (plans are made once)."""
    return run_virtual(Simulation(site, scenario, planner).run())


EventObserver = Callable[[Event], None]
MomentObserver = Callable[["Moment"], None]


class Simulation:
    """One simulated outage. ``observers`` hear every event as it happens (the demo journals
    them); ``on_moment`` hears each timeline line as it is added (the demo prints it)."""

    def __init__(
        self,
        site: SiteConfig,
        scenario: Scenario,
        planner: Planner | None = None,
        *,
        observers: Sequence[EventObserver] = (),
        on_moment: MomentObserver | None = None,
    ) -> None:
        self._observers = tuple(observers)
        self._on_moment = on_moment
        self.site = site
        self._planner = planner or Planner(site)
        self.scenario = scenario
        self.report = SimulationReport(
            scenario=scenario.name,
            required_margin_s=site.policies.required_margin.total_seconds(),
        )
        self._min_runtime_s: float | None = None
        self._poll_s = site.policies.poll_interval.total_seconds()
        """The engine reads the runtime once a poll: a trigger at ``plan + margin`` keeps the
        margin to within one poll, and the verdict allows that much."""
        self._last_dirty: dict[str, int | None] = {}
        self._lost_mains: set[UpsName] = set()
        self._outage: OutageController | None = None

    async def run(self) -> SimulationReport:
        loop = asyncio.get_running_loop()
        self.clock = LoopClock(loop, ORIGIN)
        protected = {s.resource for s in self._planner.plan(Direction.SHUTDOWN).steps}
        self.world = PowerWorld(self.site, self.scenario, self.clock, protected)
        self._shutdowns = ShutdownWatch(self.site, self.world)
        hardware = {
            s.resource for s in self._planner.plan(Direction.SHUTDOWN).steps if s.kind.is_hardware
        }
        self.own = ControllerMachine(self.site, self.clock, self.world, hardware, self._note)
        self.platforms = self._platforms()
        self.world.power_cut = self._power_cut
        self.world.power_back = self._boot
        self._providers = self._caches()
        outage = self._outage = OutageController(
            self.site,
            sources=self._sources(),
            platforms=dict(self.platforms),
            caches=DestageWatch(self.site, self._providers, self.clock, self._record),
            clock=self.clock,
            events=self._record,
            planner=self._planner,
            dry_run=True,
        )
        self.report.plan_estimate_s = outage.shutdown_plan.estimate_s
        self.report.plan_critical_path_s = outage.shutdown_plan.critical_path_s
        last_change = self._schedule(loop)
        try:
            await self._drive(outage, last_change)
        finally:
            await outage.interrupt()
        self._verdict(outage)
        return self.report

    # -- set-up ------------------------------------------------------------------------------

    def _platforms(self) -> dict[PlatformName, SimulatedPlatform]:
        behaviour = planned_behaviour(self._planner, self.scenario.steps)
        for res in self.site.resources:
            if self.site.never_powered_on(res) and res.id in behaviour:
                behaviour[res.id] = replace(
                    behaviour[res.id],
                    fail="start",
                    why="nothing can power it on: no power_on_via and no startup command",
                )
        fleet = Fleet(self._power_changed, behaviour)
        out: dict[PlatformName, SimulatedPlatform] = {}
        for name in sorted(used_platform_names(self.site)):
            settings = self._simulated_settings(name)
            out[PlatformName(name)] = SimulatedPlatform(
                PlatformName(name), settings, self.clock, fleet, self._hang(name)
            )
        return out

    def _power_changed(self, rid: ResourceId, fraction: float, state: PowerState) -> None:
        self.world.power_changed(rid, fraction, state)
        self.own.power_changed(rid, state)

    def _power_cut(self, resources: tuple[ResourceId, ...]) -> None:
        """A UPS's output went: what it alone powered is off (the platforms share a fleet)."""
        cut = format_names(resources, "resource")
        self._note(self.clock.monotonic(), f"power cut: {cut} off", "power")
        for platform in list(self.platforms.values())[:1]:
            for rid in resources:
                platform.power_lost(rid)

    def _boot(self, resources: tuple[ResourceId, ...]) -> None:
        """Power is back to upsguard's machine: its firmware powers it on."""
        self.own.booting = True
        for rid in resources:
            res = self.site.resource(rid)
            platform = self.platforms.get(PlatformName(res.platform or ""))
            if platform is not None:
                settings = self._simulated_settings(platform.name)
                platform.boot(rid, settings.host_power_on.total_seconds())

    def _hang(self, name: str) -> Hang | None:
        given = self.scenario.platforms.get(name)
        window = given.hang if given is not None else None
        if window is None:
            return None
        start = window.at.total_seconds()
        end = start + window.duration.total_seconds() if window.duration is not None else None
        return Hang(start, end)

    def _simulated_settings(self, name: str) -> SimulatedPlatformSettings:
        real = self.site.platform(name)
        if isinstance(real, SimulatedPlatformSettings):
            return real
        return SimulatedPlatformSettings(type="simulated", max_parallel=real.max_parallel)

    def _sources(self) -> dict[UpsName, UpsSource]:
        return {u.name: SimulatedUps(u, self.clock, self.world) for u in self.site.ups}

    def _caches(self) -> dict[CacheName, CacheProvider]:
        out: dict[CacheName, CacheProvider] = {}
        for cache in self.site.caches:
            settings = (
                cache
                if isinstance(cache, SimulatedCacheSettings)
                else (
                    SimulatedCacheSettings(
                        name=cache.name,
                        provider="simulated",
                        destage_timeout=cache.destage_timeout,
                        on_timeout=cache.on_timeout,
                        poll_interval=cache.poll_interval,
                    )
                )
            )
            given = self.scenario.caches.get(cache.name)
            out[cache.name] = SimulatedCache(
                settings,
                self.clock,
                dirty=given.dirty if given else None,
                rate=given.rate if given else None,
            )
        return out

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> float:
        """Put every change of the scenario on the loop; returns the time of the last."""
        planned = script.changes(self.scenario, self.world, self._mains)
        for change in planned:
            loop.call_later(change.at_s, self._change, change)
        return max((c.at_s for c in planned), default=0.0)

    def _change(self, change: script.Change) -> None:
        change.apply()
        if change.note is not None:
            self._note(self.clock.monotonic(), change.note, "scenario")

    def _mains(self, ups: list[UpsName] | None, on: bool) -> None:
        self.world.set_mains(ups, on)
        if not on:
            self._lost_mains.update(ups or list(self.world.mains))
            self._shutdowns.mains_lost(ups or list(self.world.mains))
        if on:
            self._shutdowns.mains_back(ups or list(self.world.mains), self.clock.monotonic())

    # -- the run -------------------------------------------------------------------------------

    async def _drive(self, outage: OutageController, last_change: float) -> None:
        poll = self._poll_s
        horizon = self.scenario.horizon.total_seconds()
        while self.clock.monotonic() < horizon:
            if not self.own.up:  # nothing acts while upsguard's machine is off
                if self._ran_out(outage) or self._stays_down():
                    return
                await asyncio.sleep(poll)
                continue
            view = await outage.tick()
            self._watch_runtime(view.on_battery, view.runtime_s())
            if outage.caches.flipped_at:
                await self._sample_caches()
            if self._ran_out(outage):
                return
            if self.clock.monotonic() > last_change and self._settled(outage):
                return
            await asyncio.sleep(poll)

    def _lowest_shown(self) -> float | None:
        """The lowest runtime of the outage, as the timeline shows it (the battery model's, at
        each moment, of the UPSes that lost the mains), so that the verdict's "at worst" is
        a figure of the timeline: the engine reads once a poll, and its last reading on
        battery was up to a poll before the mains came back. The engine's own lowest when
        the timeline shows none (None: the engine never saw a feed at risk)."""
        if self._min_runtime_s is None:
            return None
        shown = [
            runtime
            for moment in self.report.timeline
            for name, (_, runtime) in moment.battery.items()
            if name in self._lost_mains
        ]
        return min(shown, default=self._min_runtime_s)

    def _watch_runtime(self, on_battery: bool, runtime: float | None) -> None:
        if on_battery and runtime is not None:
            low = self._min_runtime_s
            self._min_runtime_s = runtime if low is None else min(low, runtime)

    async def _sample_caches(self) -> None:
        """Each cache's dirty bytes while the caches drain, read from the simulated provider
        itself (a side-effect free read: the destage watch's own polls and rates stay as they
        are); a cache found clean is read no more."""
        at = self.clock.monotonic()
        for name, provider in self._providers.items():
            if self._last_dirty.get(name, -1) == 0:
                continue
            for target in await provider.targets():
                dirty = (await provider.read(target)).dirty_bytes
                key = f"{name}/{target.name}" if target.name != name else name
                if self._last_dirty.get(key, -1) != dirty:
                    self._last_dirty[key] = dirty
                    self.report.cache_samples.append(CacheSample(key, at, dirty))

    def _stays_down(self) -> bool:
        """upsguard's machine is off and nothing will bring its power back."""
        own = self.own.own
        if own is None or self.own.booting:
            return False
        if any(self.world.powers_again(u) for u in self.world.ups_of(own)):
            return False
        self.report.stays_down = (
            f"upsguard's machine {own} is off and no UPS load cycle brings its power back"
        )
        return True

    def _settled(self, outage: OutageController) -> bool:
        """Nothing more will happen: back to normal, or down with no power to come back (and
        no UPS left to tell at the critical floor)."""
        if outage.busy or outage.waits_for_the_floor:
            return False
        phase = outage.engine.phase
        if phase is Phase.NORMAL:
            return all(self.world.mains.values())
        return phase is Phase.DOWN and not any(self.world.mains.values())

    def _ran_out(self, outage: OutageController) -> bool:
        """A protected resource lost power while still on: the battery did not last (or a
        UPS failed under what nothing else supplies)."""
        if not self.world.losses:
            return False
        loss = self.world.losses[0]
        executor = outage.executor
        running = sorted(executor.running) if executor is not None and outage.busy else []
        done = executor.result.outcomes if executor is not None else {}
        lost = set(loss.resources)
        pending = [
            s.id for s in outage.shutdown_plan.steps if s.resource in lost and s.id not in done
        ]
        rep = self.report
        rep.ran_out_at_s = loss.at_s
        rep.ran_out_during = [str(s) for s in (running or pending[:5])]
        rep.lost_power = list(loss.resources)
        what = "ran out of battery" if loss.why == "ran empty" else loss.why
        names = format_names(loss.resources, "resource")
        self._note(loss.at_s, f"UPS {loss.ups} {what}: {names} lost power", "ran_out")
        return True

    # -- recording -----------------------------------------------------------------------------

    def _record(self, event: Event) -> None:
        for observer in self._observers:
            observer(event)
        if isinstance(event, StepFinished) and event.state is StepState.FAILED:
            self.report.failed_steps.append(f"{event.step}: {event.detail}")
        if isinstance(event, RiskAccepted):
            self.report.risks.append(event.what)
        if isinstance(event, RunStarted) and event.spec.kind is RunKind.SHUTDOWN:
            self._shutdowns.started(event.spec)
        if isinstance(event, PointOfNoReturn):
            executor = self._outage.executor if self._outage is not None else None
            needed = after_point_of_no_return(executor.plan) if executor is not None else 0.0
            self._shutdowns.point_of_no_return(event.run, self.clock.monotonic(), needed)
        if isinstance(event, RunFinished) and event.spec.kind is RunKind.SHUTDOWN:
            self._shutdown_finished(event)
        after_a_shutdown = self.report.shutdown_finished_at_s is not None
        if isinstance(event, PhaseChanged) and event.new is Phase.NORMAL and after_a_shutdown:
            self.report.back_at_s = self.clock.monotonic()
        text = describe(event)
        if text is not None:
            self._note(self.clock.monotonic(), text, event.kind)

    def _shutdown_finished(self, event: RunFinished) -> None:
        if event.outcome not in (RunOutcome.DONE, RunOutcome.FAILED):
            self._shutdowns.dropped(event.spec)
            return
        now = self.clock.monotonic()
        end = self._shutdowns.finished(event.spec, now)
        rep = self.report
        if end is None:
            rep.shutdown_finished_at_s = rep.shutdown_finished_at_s or now
        elif rep.end_of_shutdown is None or end.margin_s < rep.end_of_shutdown.margin_s:
            rep.end_of_shutdown = end
            rep.shutdown_finished_at_s = now
            rep.margin_s = end.margin_s

    def _note(self, at: float, text: str, kind: str) -> None:
        moment = Moment(at, text, kind, self.world.snapshot())
        self.report.timeline.append(moment)
        if self._on_moment is not None:
            self._on_moment(moment)

    # -- the verdict -----------------------------------------------------------------------------

    def _verdict(self, outage: OutageController) -> None:
        rep = self.report
        rep.end_s = self.clock.monotonic()
        rep.final_phase = outage.engine.phase.value
        if rep.ran_out_at_s is not None:
            during = format_names(rep.ran_out_during, "step") or "the shutdown"
            loss = self.world.losses[0]
            if loss.why == "ran empty":
                rep.verdict = f"runs out of battery at T+{format_duration(loss.at_s)}"
            else:
                rep.verdict = f"UPS {loss.ups} {loss.why} at T+{format_duration(loss.at_s)}"
            lost = format_names(rep.lost_power, "resource")
            rep.verdict += f", during {during}: {lost} lost power"
            rep.ok = False
            return
        if rep.margin_s is None and rep.shutdown_finished_at_s is None:
            rep.margin_s = self._lowest_shown()
        margin = rep.margin_s
        required = rep.required_margin_s
        if rep.end_of_shutdown is not None:
            rep.verdict = describe_end(rep.end_of_shutdown, required)
            rep.needless = rep.end_of_shutdown.needless(required)
        elif rep.shutdown_finished_at_s is not None:
            rep.verdict = (
                f"shutdown finishes at T+{format_duration(rep.shutdown_finished_at_s)}, "
                "with no UPS on battery"
            )
        elif margin is not None:
            rep.verdict = (
                f"no full shutdown needed; at worst {format_duration(margin)} of battery was left"
            )
        elif self._lost_mains:
            names = ", ".join(sorted(self._lost_mains))
            rep.verdict = f"no feed was at risk: {names} lost the mains, another UPS held"
        else:
            rep.verdict = "the site never ran on battery"
        rep.unguarded = self.own.unguarded
        if rep.stays_down is not None:
            rep.verdict += f"; the site stays down: {rep.stays_down}"
        elif rep.back_at_s is not None:
            rep.verdict += f"; the site is back at T+{format_duration(rep.back_at_s)}"
        problems = []
        for left in rep.unguarded:
            problems.append(
                f"unguarded from T+{format_duration(left.from_s)}: {', '.join(left.resources)} "
                "ran on while upsguard's machine was off"
            )
        if margin is not None and margin < required - self._poll_s:
            problems.append(f"less than the required margin of {format_duration(required)}")
        if rep.failed_steps:
            problems.append(f"{len(rep.failed_steps)} step(s) failed")
        if rep.risks:
            problems.append(f"{len(rep.risks)} risk(s) taken with dirty caches")
        rep.ok = not problems
        if problems:
            rep.verdict += ": " + "; ".join(problems)
