"""The phase machine: from what the UPSes say to what the site should do now.

    normal -> on_battery -> shedding -> shutting_down -> down -> recovering -> normal

It is pure: ``evaluate`` takes a ``PowerView`` and what the run ledger says of the
site's runs (``SiteRuns``) and returns ``Decision``s; the outage controller carries them
out.

Feeds: the phase is the site's, but an outage is a feed's. The shutdown triggers are
evaluated per feed at risk (its runtime against the plan of what it powers), a shutdown
is for the feeds that triggered it, and a feed that triggers later, while the site is
shutting down or down, extends it. Decisions carry their feeds; the controller turns them
into the resources to stop (what the feeds power, and what needs those).

The debounce counts on the feed's own clock (``FeedReading.at_risk_for_s``, which
includes a lost link's grace), so it never adds to the grace nor restarts with the
engine. Decisions are level-triggered: a phase that wants a shutdown no run carries gets
one on the next tick. Debounce (on battery
for ``after``), hysteresis (on line for ``online_for`` before power counts as
back) and the hold all live here, so the simulator and the service decide
alike.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from upsguard.config.policies import PoliciesConfig
from upsguard.config.types import format_duration
from upsguard.decisions import NO_PLAN, PlanTime, Reckoning
from upsguard.models import Phase
from upsguard.policies.power import FeedReading
from upsguard.policies.reckoning import reckon
from upsguard.runs import SiteRuns


class Act(enum.StrEnum):
    CACHES_WRITE_THROUGH = "caches_write_through"
    START_SHEDDING = "start_shedding"
    START_SHUTDOWN = "start_shutdown"
    CANCEL_SHUTDOWN = "cancel_shutdown"
    CANCEL_STARTUP = "cancel_startup"
    START_STARTUP = "start_startup"
    CACHES_WRITE_BACK = "caches_write_back"


@dataclass(frozen=True, slots=True)
class Decision:
    act: Act
    reason: str
    feeds: tuple[str, ...] | None = None
    """The feeds the act is for; None for the whole site."""
    figures: Reckoning | None = None
    """The condition that made it, with the figures it was judged on."""


@dataclass(frozen=True, slots=True)
class PowerView:
    """The site's power at one moment: every feed, and the lowest charge of any UPS."""

    at_s: float
    feeds: tuple[FeedReading, ...]
    min_charge_pct: float | None
    """None when the charge of a UPS is not read now (none reported, out of contact): the
    startup's ``charge_above`` is then unknown, and waits."""

    @property
    def at_risk(self) -> list[FeedReading]:
        return [f for f in self.feeds if f.at_risk]

    @property
    def on_battery(self) -> bool:
        return bool(self.at_risk)

    @property
    def mains_seen(self) -> bool:
        """Every feed read on mains now. A UPS out of contact, or never read since a restart,
        is no outage (it starts no shutdown), but it is no sign of the mains either: what
        ends a shutdown or starts the site waits for the mains to be seen."""
        return all(f.mains_seen for f in self.feeds)

    def runtime_s(self) -> float | None:
        values = [f.runtime_s for f in self.at_risk if f.runtime_s is not None]
        return min(values) if values else None


Values = dict[str, float | None]


def _calls_for_shutdown(view: PowerView) -> bool:
    """The power still calls for the shutdown its phase wants, when no run carries it: a
    feed at risk (or not read), or a forced shutdown. Mains read on every feed, for less
    than ``power_returns.online_for``, it waits for them to count as back or to fail
    again: a controller restarted as the site comes back (its run closed on mains) never
    starts a shutdown of it."""
    return view.on_battery or any(f.forced_shutdown for f in view.feeds)


def _feed_flags(feed: FeedReading) -> set[str]:
    flags = {"on_battery"} if feed.at_risk else set()
    if feed.low_battery:
        flags.add("low_battery")
    if feed.forced_shutdown:
        flags.add("fsd")
    if feed.lost:
        flags.add("ups_lost")
    return flags


def _worst(feeds: list[FeedReading]) -> tuple[Values, set[str]]:
    """Values and flags of several feeds at once: the worst of each."""
    runtimes = [f.runtime_s for f in feeds if f.runtime_s is not None]
    charges = [f.charge_pct for f in feeds if f.charge_pct is not None]
    rates = [f.depletion_pct_per_min for f in feeds if f.depletion_pct_per_min is not None]
    values: Values = {
        "runtime": min(runtimes) if runtimes else None,
        "charge": min(charges) if charges else None,
        "depletion": max(rates) if rates else None,
        "on_battery_for": max((f.at_risk_for_s for f in feeds), default=None),
    }
    flags: set[str] = set().union(*(_feed_flags(f) for f in feeds)) if feeds else set()
    return values, flags


def condition_inputs(feed: FeedReading) -> tuple[Values, set[str]]:
    """What the shutdown conditions are evaluated on for one feed (status shows them)."""
    return _worst([feed])


PhaseListener = Callable[[Phase, Phase, str, Reckoning | None], None]
PlanSeconds = Mapping[str, PlanTime]
"""Per feed: how long its shutdown would take from now (its plan, and destage ahead)."""


@dataclass
class PhaseEngine:
    policies: PoliciesConfig
    on_change: PhaseListener | None = None
    phase: Phase = Phase.NORMAL
    held: str | None = None  # the reason of a manual hold
    online_since: float | None = None
    at_floor: bool = False

    def evaluate(self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds) -> list[Decision]:
        self._track(view)
        self.at_floor = any(self._floor(f) for f in view.at_risk)
        decisions: list[Decision] = []
        self._follow_the_run(runs)
        step = {
            Phase.NORMAL: self._normal,
            Phase.ON_BATTERY: self._on_battery,
            Phase.SHEDDING: self._on_battery,
            Phase.SHUTTING_DOWN: self._shutting_down,
            Phase.DOWN: self._down,
            Phase.RECOVERING: self._recovering,
        }
        for _ in range(3):  # a tick may pass through several phases (LB at once: shut down)
            before = self.phase
            step[self.phase](view, runs, plan_s, decisions)
            if self.phase is before:
                break
        return decisions

    def _follow_the_run(self, runs: SiteRuns) -> None:
        """A policy's shutdown in progress means the phase is shutting_down, whatever this
        engine read before: one resumed from the journal, or taken over from the store by a
        controller that followed the outage's end as standby, found the phase normal or
        recovering, where nothing cancels a shutdown when the mains stay, so its point of
        no return waited for good. From shutting_down the mains cancel it, or it goes on."""
        inconsistent = self.phase in (Phase.NORMAL, Phase.RECOVERING)
        if inconsistent and runs.shutdown_running and not runs.shutdown_manual:
            self._move(Phase.SHUTTING_DOWN, "a shutdown run is in progress (resumed)")

    # -- manual overrides ----------------------------------------------------------------

    def force(self, phase: Phase, reason: str) -> None:
        """Move to a phase because a person said so (``trigger``, ``abort``)."""
        if phase is not self.phase:
            self._move(phase, reason)

    def restore(self, phase: Phase, online_for_s: float | None = None) -> None:
        """Take the phase a previous controller journaled, without announcing a change, and
        how long mains have been back (the startup policy's timer survives a restart)."""
        self.phase = phase
        self._restored_online_for = online_for_s

    def hold(self, reason: str) -> None:
        """Defer automatic runbooks down to the critical floor."""
        self.held = reason or "held"

    def release(self) -> None:
        self.held = None

    # -- bookkeeping -------------------------------------------------------------------

    _restored_online_for: float | None = None

    def _track(self, view: PowerView) -> None:
        if view.on_battery:
            self.online_since = None
            self._restored_online_for = None
        elif self.online_since is None and view.mains_seen:
            self.online_since = view.at_s - (self._restored_online_for or 0.0)
            self._restored_online_for = None

    def online_for(self, view: PowerView) -> float | None:
        return None if self.online_since is None else view.at_s - self.online_since

    def _floor(self, feed: FeedReading) -> bool:
        floor = self.policies.critical_floor
        charge, runtime = feed.charge_pct, feed.runtime_s
        return (charge is not None and charge < floor.charge_below) or (
            runtime is not None and runtime < floor.runtime_below.total_seconds()
        )

    def _move(self, new: Phase, reason: str, figures: Reckoning | None = None) -> None:
        old, self.phase = self.phase, new
        if self.on_change is not None:
            self.on_change(old, new, reason, figures)

    def _allowed(self) -> bool:
        """A hold defers automatic runbooks, down to the critical floor."""
        return self.held is None or self.at_floor

    def _online_enough(self, view: PowerView, span_s: float) -> bool:
        online_for = self.online_for(view)
        return online_for is not None and online_for >= span_s

    def _power_back(self, view: PowerView) -> bool:
        """Mains seen now, and back long enough (``power_returns.online_for``) to count as
        returned."""
        span_s = self.policies.power_returns.online_for.total_seconds()
        return view.mains_seen and self._online_enough(view, span_s)

    def _named(self, view: PowerView, text: str, feeds: list[FeedReading]) -> str:
        """A reason names its feeds when the site has more than one."""
        if len(view.feeds) < 2:
            return text
        return f"{text} ({', '.join(f.name for f in feeds)})"

    def _shutdown_triggers(
        self, feeds: list[FeedReading], plan_s: PlanSeconds
    ) -> list[tuple[FeedReading, Reckoning]]:
        """The feeds whose own triggers hold now (or that are at the critical floor), each
        with the figures of the first trigger that holds."""
        found = []
        for feed in feeds:
            values, flags = _worst([feed])
            plan = plan_s.get(feed.name, NO_PLAN)
            judged = (
                reckon(c, feed.name, values, flags, plan) for c in self.policies.shutdown.when_any
            )
            hit = next((r for r in judged if r.holds), None)
            if hit is not None:
                found.append((feed, hit))
            elif self._floor(feed):
                found.append((feed, self._floor_reckoning(feed)))
        return found

    def shutdown_due(self, view: PowerView, plan_s: PlanSeconds) -> list[str]:
        """The feeds on battery whose shutdown triggers hold now (or at the critical floor):
        what a person's startup must not power up again."""
        return [feed.name for feed, _ in self._shutdown_triggers(view.at_risk, plan_s)]

    def _floor_reckoning(self, feed: FeedReading) -> Reckoning:
        floor = self.policies.critical_floor
        if feed.charge_pct is not None and feed.charge_pct < floor.charge_below:
            return Reckoning(
                "critical floor",
                feed.name,
                True,
                metric="charge",
                value=feed.charge_pct,
                limit=floor.charge_below,
            )
        limit = floor.runtime_below.total_seconds()
        return Reckoning(
            "critical floor", feed.name, True, metric="runtime", value=feed.runtime_s, limit=limit
        )

    def _start_shutdown(
        self,
        view: PowerView,
        triggered: list[tuple[FeedReading, Reckoning]],
        covered: tuple[str, ...] | None,
        out: list[Decision],
    ) -> None:
        """Shut down the feeds that triggered (with those a shutdown covers already)."""
        feeds = [f for f, _ in triggered]
        figures = triggered[0][1]
        reason = self._named(view, _said(figures), feeds)
        if self.held is not None and self.at_floor:
            reason = f"critical floor reached during a hold ({self.held}): {reason}"
        names = sorted({*(covered or ()), *(f.name for f in feeds)})
        scope = None if len(names) == len(view.feeds) else tuple(names)
        if self.phase is not Phase.SHUTTING_DOWN:
            self._move(Phase.SHUTTING_DOWN, reason, figures)
        out.append(Decision(Act.CACHES_WRITE_THROUGH, "shutting down", scope))
        out.append(Decision(Act.START_SHUTDOWN, reason, scope, figures))

    def _uncovered_triggers(
        self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds
    ) -> list[tuple[FeedReading, Reckoning]]:
        """Feeds at risk that no shutdown covers and whose triggers hold."""
        covered = runs.shutdown_feeds
        if covered is None:
            return []
        left = [f for f in view.at_risk if f.name not in covered]
        return self._shutdown_triggers(left, plan_s)

    # -- phases ---------------------------------------------------------------------------

    def _normal(
        self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds, out: list[Decision]
    ) -> None:
        risky = view.at_risk
        if not risky:
            return
        values, flags = _worst(risky)
        urgent = flags & {"low_battery", "fsd"}
        on_for = values["on_battery_for"] or 0.0
        if not urgent and on_for < self.policies.on_battery.after.total_seconds():
            return
        names = ", ".join(f.name for f in risky)
        self._move(Phase.ON_BATTERY, f"on battery for {format_duration(on_for)} ({names})")
        if "caches_write_through" in self.policies.on_battery.then:
            feeds = tuple(f.name for f in risky)
            scope = None if len(feeds) == len(view.feeds) else feeds
            out.append(Decision(Act.CACHES_WRITE_THROUGH, "on battery", scope))

    def _on_battery(
        self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds, out: list[Decision]
    ) -> None:
        if not view.on_battery:
            if self._power_back(view):
                self._move(Phase.RECOVERING, "power back")
            return
        triggered = self._shutdown_triggers(view.at_risk, plan_s)
        if triggered and self._allowed():
            self._start_shutdown(view, triggered, (), out)
            return
        shedding = self.policies.shedding
        if self.phase is Phase.ON_BATTERY and shedding is not None and self._allowed():
            values, flags = _worst(view.at_risk)
            site_plan = max(plan_s.values(), key=lambda p: p.total_s, default=NO_PLAN)
            names = ", ".join(f.name for f in view.at_risk)
            judged = (reckon(c, names, values, flags, site_plan) for c in shedding.when_any)
            shed = next((r for r in judged if r.holds), None)
            if shed is not None:
                self._move(Phase.SHEDDING, _said(shed), shed)
                feeds = tuple(f.name for f in view.at_risk)
                scope = None if len(feeds) == len(view.feeds) else feeds
                out.append(Decision(Act.START_SHEDDING, _said(shed), scope, shed))

    def _shutting_down(
        self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds, out: list[Decision]
    ) -> None:
        back = self._power_back(view)
        cancel = self.policies.power_returns.before_point_of_no_return == "cancel"
        automatic = runs.shutdown_running and not runs.shutdown_manual
        if back and cancel and automatic and not runs.point_of_no_return:
            self._move(Phase.RECOVERING, "power back before the point of no return")
            out.append(Decision(Act.CANCEL_SHUTDOWN, "power back before the point of no return"))
            return
        if any(d.act is Act.START_SHUTDOWN for d in out):
            return
        if not runs.shutdown_running and not runs.shutdown_finished:
            if back and not runs.shutdown_manual:
                self._move(Phase.RECOVERING, "power back, and no shutdown run was under way")
            elif _calls_for_shutdown(view) and self._allowed():  # level-triggered: none runs
                feeds = tuple(f.name for f in view.at_risk)
                scope = None if not feeds or len(feeds) == len(view.feeds) else feeds
                out.append(Decision(Act.CACHES_WRITE_THROUGH, "shutting down", scope))
                out.append(Decision(Act.START_SHUTDOWN, "the site is shutting down", scope))
            return
        extend = self._uncovered_triggers(view, runs, plan_s)
        if extend and self._allowed():
            self._start_shutdown(view, extend, runs.shutdown_feeds, out)
        elif runs.shutdown_finished:
            self._move(Phase.DOWN, "shutdown runbook finished")

    def _down(
        self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds, out: list[Decision]
    ) -> None:
        if runs.shutdown_manual:
            return  # a person shut the site down: a person starts it
        if self._power_back(view):
            self._move(Phase.RECOVERING, "power back")
            return
        extend = self._uncovered_triggers(view, runs, plan_s)
        if extend and self._allowed():
            self._start_shutdown(view, extend, runs.shutdown_feeds, out)

    def _recovering(
        self, view: PowerView, runs: SiteRuns, plan_s: PlanSeconds, out: list[Decision]
    ) -> None:
        if view.on_battery:
            values, flags = _worst(view.at_risk)
            on_for = values["on_battery_for"] or 0.0
            if (
                flags & {"low_battery", "fsd"}
                or on_for >= self.policies.on_battery.after.total_seconds()
            ):
                if runs.startup_running:
                    out.append(Decision(Act.CANCEL_STARTUP, "on battery again"))
                self._move(Phase.ON_BATTERY, f"on battery again for {format_duration(on_for)}")
                feeds = tuple(f.name for f in view.at_risk)
                scope = None if len(feeds) == len(view.feeds) else feeds
                out.append(Decision(Act.CACHES_WRITE_THROUGH, "on battery again", scope))
            return
        startup = self.policies.startup
        charge = view.min_charge_pct
        ready = (
            view.mains_seen
            and self._online_enough(view, startup.online_for.total_seconds())
            and (
                startup.charge_above <= 0 or (charge is not None and charge >= startup.charge_above)
            )
        )
        wants_startup = runs.something_stopped and not runs.startup_finished
        if runs.startup_failed and not runs.startup_running:
            return  # waits for 'upsguard trigger startup'
        if wants_startup and not runs.startup_running:
            cancelled = runs.cancelled_before_ponr and view.mains_seen
            if startup.automatic and self._allowed() and (ready or cancelled):
                why = (
                    "shutdown cancelled"
                    if runs.cancelled_before_ponr and not ready
                    else (
                        f"on line for {format_duration(startup.online_for)}, charge above "
                        f"{startup.charge_above:.0f} %"
                    )
                )
                if "startup_runbook" in startup.then:
                    out.append(Decision(Act.START_STARTUP, why))
            return
        if ready and not runs.startup_running:
            if "caches_write_back" in startup.then:
                out.append(
                    Decision(Act.CACHES_WRITE_BACK, f"charge above {startup.charge_above:.0f} %")
                )
            self._move(Phase.NORMAL, "recovered")


def _said(figures: Reckoning) -> str:
    """A decision's reason: its condition, and the figures when they say more."""
    said = figures.figures()
    return figures.condition if said == figures.condition else f"{figures.condition}: {said}"
