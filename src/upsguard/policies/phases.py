"""The phase machine: from what the UPSes say to what the site should do now.

    normal -> on_battery -> shedding -> shutting_down -> down -> recovering -> normal

It is pure: ``evaluate`` takes a ``PowerView`` and what the run ledger says of the
site's runs (``SiteRuns``) and returns ``Decision``s; the outage controller carries them
out. Debounce (on battery
for ``after``), hysteresis (on line for ``online_for`` before power counts as
back) and the hold all live here, so the simulator and the service decide
alike.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from upsguard.config.conditions import Condition
from upsguard.config.policies import PoliciesConfig
from upsguard.config.types import format_duration
from upsguard.models import Phase
from upsguard.policies.power import FeedReading
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


@dataclass(frozen=True, slots=True)
class PowerView:
    """The site's power at one moment: every feed, and the lowest charge of any UPS."""

    at_s: float
    feeds: tuple[FeedReading, ...]
    min_charge_pct: float | None

    @property
    def at_risk(self) -> list[FeedReading]:
        return [f for f in self.feeds if f.at_risk]

    @property
    def on_battery(self) -> bool:
        return bool(self.at_risk)

    def flags(self) -> set[str]:
        flags = set()
        risky = self.at_risk
        if risky:
            flags.add("on_battery")
        if any(f.low_battery for f in risky):
            flags.add("low_battery")
        if any(f.forced_shutdown for f in self.feeds):
            flags.add("fsd")
        if any(f.lost for f in self.feeds):
            flags.add("ups_lost")
        return flags

    def runtime_s(self) -> float | None:
        values = [f.runtime_s for f in self.at_risk if f.runtime_s is not None]
        return min(values) if values else None

    def charge_pct(self) -> float | None:
        values = [f.charge_pct for f in self.at_risk if f.charge_pct is not None]
        return min(values) if values else None

    def depletion(self) -> float | None:
        values = [
            f.depletion_pct_per_min for f in self.at_risk if f.depletion_pct_per_min is not None
        ]
        return max(values) if values else None


PhaseListener = Callable[[Phase, Phase, str], None]


@dataclass
class PhaseEngine:
    policies: PoliciesConfig
    on_change: PhaseListener | None = None
    phase: Phase = Phase.NORMAL
    held: str | None = None  # the reason of a manual hold
    on_battery_since: float | None = None
    online_since: float | None = None
    at_floor: bool = False
    last_values: dict[str, float | None] = field(default_factory=dict)

    def evaluate(self, view: PowerView, runs: SiteRuns, plan_s: float) -> list[Decision]:
        self._track(view)
        values = self._values(view)
        flags = view.flags()
        self.last_values = values
        self.at_floor = view.on_battery and self._floor(values)
        decisions: list[Decision] = []
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
            step[self.phase](view, runs, values, flags, plan_s, decisions)
            if self.phase is before:
                break
        return decisions

    # -- manual overrides ----------------------------------------------------------------

    def force(self, phase: Phase, reason: str) -> None:
        """Move to a phase because a person said so (``trigger``, ``abort``)."""
        if phase is not self.phase:
            self._move(phase, reason)

    def restore(self, phase: Phase) -> None:
        """Take the phase a previous controller journaled, without announcing a change."""
        self.phase = phase

    def hold(self, reason: str) -> None:
        """Defer automatic runbooks down to the critical floor."""
        self.held = reason or "held"

    def release(self) -> None:
        self.held = None

    # -- bookkeeping -------------------------------------------------------------------

    def _track(self, view: PowerView) -> None:
        if view.on_battery:
            self.online_since = None
            if self.on_battery_since is None:
                self.on_battery_since = view.at_s
        else:
            self.on_battery_since = None
            if self.online_since is None:
                self.online_since = view.at_s

    def _values(self, view: PowerView) -> dict[str, float | None]:
        since = self.on_battery_since
        return {
            "runtime": view.runtime_s(),
            "charge": view.charge_pct(),
            "depletion": view.depletion(),
            "on_battery_for": view.at_s - since if since is not None else None,
            "online_for": view.at_s - self.online_since if self.online_since is not None else None,
            "min_charge": view.min_charge_pct,
        }

    def _floor(self, values: dict[str, float | None]) -> bool:
        floor = self.policies.critical_floor
        charge, runtime = values["charge"], values["runtime"]
        return (charge is not None and charge < floor.charge_below) or (
            runtime is not None and runtime < floor.runtime_below.total_seconds()
        )

    def _move(self, new: Phase, reason: str) -> None:
        old, self.phase = self.phase, new
        if self.on_change is not None:
            self.on_change(old, new, reason)

    def _first(
        self,
        conditions: list[Condition],
        values: dict[str, float | None],
        flags: set[str],
        plan_s: float,
    ) -> Condition | None:
        return next((c for c in conditions if c.holds(values, flags, plan_s)), None)

    def _allowed(self) -> bool:
        """A hold defers automatic runbooks, down to the critical floor."""
        return self.held is None or self.at_floor

    def _online_enough(self, values: dict[str, float | None], span_s: float) -> bool:
        online_for = values["online_for"]
        return online_for is not None and online_for >= span_s

    def _power_back(self, view: PowerView, values: dict[str, float | None]) -> bool:
        """Mains back long enough (``power_returns.online_for``) to count as returned."""
        span_s = self.policies.power_returns.online_for.total_seconds()
        return not view.on_battery and self._online_enough(values, span_s)

    # -- phases ---------------------------------------------------------------------------

    def _normal(
        self,
        view: PowerView,
        runs: SiteRuns,
        values: dict[str, float | None],
        flags: set[str],
        plan_s: float,
        out: list[Decision],
    ) -> None:
        if not view.on_battery:
            return
        urgent = flags & {"low_battery", "fsd"}
        on_for = values["on_battery_for"] or 0.0
        if not urgent and on_for < self.policies.on_battery.after.total_seconds():
            return
        names = ", ".join(f.name for f in view.at_risk)
        self._move(Phase.ON_BATTERY, f"on battery for {format_duration(on_for)} ({names})")
        if "caches_write_through" in self.policies.on_battery.then:
            out.append(Decision(Act.CACHES_WRITE_THROUGH, "on battery"))

    def _on_battery(
        self,
        view: PowerView,
        runs: SiteRuns,
        values: dict[str, float | None],
        flags: set[str],
        plan_s: float,
        out: list[Decision],
    ) -> None:
        if not view.on_battery:
            if self._power_back(view, values):
                self._move(Phase.RECOVERING, "power back")
            return
        trigger = self._first(self.policies.shutdown.when_any, values, flags, plan_s)
        reason = f"{trigger.text}" if trigger else ("critical floor" if self.at_floor else None)
        if reason is not None and self.held is not None and self.at_floor:
            reason = f"critical floor reached during a hold ({self.held}): {reason}"
        if reason is not None and self._allowed():
            self._move(Phase.SHUTTING_DOWN, reason)
            out.append(Decision(Act.CACHES_WRITE_THROUGH, "shutting down"))
            out.append(Decision(Act.START_SHUTDOWN, reason))
            return
        shedding = self.policies.shedding
        if self.phase is Phase.ON_BATTERY and shedding is not None and self._allowed():
            shed = self._first(shedding.when_any, values, flags, plan_s)
            if shed is not None:
                self._move(Phase.SHEDDING, shed.text)
                out.append(Decision(Act.START_SHEDDING, shed.text))

    def _shutting_down(
        self,
        view: PowerView,
        runs: SiteRuns,
        values: dict[str, float | None],
        flags: set[str],
        plan_s: float,
        out: list[Decision],
    ) -> None:
        back = self._power_back(view, values)
        cancel = self.policies.power_returns.before_point_of_no_return == "cancel"
        automatic = runs.shutdown_running and not runs.shutdown_manual
        if back and cancel and automatic and not runs.point_of_no_return:
            self._move(Phase.RECOVERING, "power back before the point of no return")
            out.append(Decision(Act.CANCEL_SHUTDOWN, "power back before the point of no return"))
            return
        if runs.shutdown_running or any(d.act is Act.START_SHUTDOWN for d in out):
            return
        if runs.shutdown_finished:
            self._move(Phase.DOWN, "shutdown runbook finished")
        elif self._allowed():  # level-triggered: the phase wants a shutdown and none runs
            out.append(Decision(Act.START_SHUTDOWN, "the site is shutting down and no run is"))

    def _down(
        self,
        view: PowerView,
        runs: SiteRuns,
        values: dict[str, float | None],
        flags: set[str],
        plan_s: float,
        out: list[Decision],
    ) -> None:
        if runs.shutdown_manual:
            return  # a person shut the site down: a person starts it
        if self._power_back(view, values):
            self._move(Phase.RECOVERING, "power back")

    def _recovering(
        self,
        view: PowerView,
        runs: SiteRuns,
        values: dict[str, float | None],
        flags: set[str],
        plan_s: float,
        out: list[Decision],
    ) -> None:
        if view.on_battery:
            on_for = values["on_battery_for"] or 0.0
            if (
                flags & {"low_battery", "fsd"}
                or on_for >= self.policies.on_battery.after.total_seconds()
            ):
                if runs.startup_running:
                    out.append(Decision(Act.CANCEL_STARTUP, "on battery again"))
                self._move(Phase.ON_BATTERY, f"on battery again for {format_duration(on_for)}")
                out.append(Decision(Act.CACHES_WRITE_THROUGH, "on battery again"))
            return
        startup = self.policies.startup
        charge = values["min_charge"]
        ready = self._online_enough(values, startup.online_for.total_seconds()) and (
            charge is None or charge >= startup.charge_above
        )
        wants_startup = runs.something_stopped and not runs.startup_finished
        if runs.startup_failed and not runs.startup_running:
            return  # waits for 'upsguard trigger startup'
        if wants_startup and not runs.startup_running:
            if startup.automatic and self._allowed() and (ready or runs.cancelled_before_ponr):
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
