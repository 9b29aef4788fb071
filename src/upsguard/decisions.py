"""The figures a decision is made on, kept with it (core: the events carry them).

"runtime < plan + 5m" firing with 32 minutes of runtime left says nothing by itself: only
the figures do ("runtime 13m < plan 8m05s + destage 10m (not measured yet) + margin 5m").
A condition judged over one feed is a ``Reckoning``: the condition, the value, the limit and
what the limit was made of. The phase engine decides on it, the decision's reason says it
in words, and the log, the journal, ``status`` and the report all carry the same figures.
``policies.reckoning.reckon`` judges a condition into one.
"""

from __future__ import annotations

from dataclasses import dataclass

from upsguard.units import format_duration

_NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_UNITS = {"runtime": "s", "on_battery_for": "s", "charge": "%", "depletion": "%/min"}


@dataclass(frozen=True, slots=True)
class PlanTime:
    """How long a feed's shutdown would take from now: its plan, and the destage ahead.

    The destage runs while the guests shut down; only the host and storage steps in a cache's
    data path wait for it. So it adds to the plan only the wait it causes there
    (``with_destage_s``, ``runbooks.schedule.finish_with_destage``), not its whole length."""

    plan_s: float
    destage_s: float = 0.0
    destage_measured: bool = True
    """False while a dirty cache's drain rate is not measured yet: its destage is counted at
    its ``worst_case_rate``, or as its whole ``destage_timeout``."""
    with_destage_s: float | None = None
    """The plan with its host steps waiting for the destage; None: not placed in the plan,
    counted whole after it (the most it can add)."""

    @property
    def total_s(self) -> float:
        if self.with_destage_s is not None:
            return max(self.plan_s, self.with_destage_s)
        return self.plan_s + self.destage_s


NO_PLAN = PlanTime(0.0)


@dataclass(frozen=True, slots=True)
class Outlook:
    """When a feed's shutdown will start, as its triggers and figures stand now: what an alert
    says upsguard will do next. Each figure is None when it is not known (a runtime the UPS
    does not report, a drain not measured yet): unknown, never a guess."""

    runtime_s: float | None
    """The runtime the feed has left."""
    due_now: bool = False
    """A shutdown trigger holds already (or the critical floor is reached)."""
    condition: str | None = None
    """The trigger that fires first at the present drain (``runtime < plan + 5m``), or the
    one that holds; None when none can be foreseen."""
    metric: str | None = None
    """What that trigger compares (``runtime``, ``charge``, ``on_battery_for``); None for a
    flag (``low_battery``)."""
    limit: float | None = None
    """The value at which it fires (seconds of runtime, a charge in %, seconds on battery)."""
    fires_in_s: float | None = None
    """How long from now it fires at the present drain; 0 when due now."""


@dataclass(frozen=True, slots=True)
class Reckoning:
    """One condition judged over one feed, with its figures."""

    condition: str
    feed: str
    holds: bool
    metric: str | None = None
    """What a comparison compares (None for a flag: ``low_battery``, ``fsd``)."""
    op: str = "<"
    value: float | None = None
    limit: float | None = None
    plan: PlanTime | None = None
    """What the limit counted of the plan (``runtime < plan + 5m``)."""
    offset_s: float = 0.0
    """The rest of such a limit: the margin after ``plan +``."""

    def figures(self) -> str:
        """The figures in words: ``runtime 13m < plan 8m05s + destage 10m (not measured
        yet) + margin 5m``; for a flag, the flag."""
        if self.metric is None or self.value is None or self.limit is None:
            return self.condition
        op = self.op if self.holds else _NEGATION[self.op]
        left = f"{self.metric} {_amount(self.metric, self.value)}"
        if self.plan is None:
            right = _amount(self.metric, self.limit)
            if _amount(self.metric, self.value) == right and _UNITS.get(self.metric) == "s":
                # rounded alike ("2m20s < 2m20s"): the seconds tell them apart
                return f"{self.metric} {self.value:.1f}s {op} {self.limit:.0f}s"
            return f"{left} {op} {right}"
        limit = f"plan {format_duration(self.plan.plan_s)}{_destage(self.plan)}"
        if self.offset_s > 0:
            limit += f" + margin {format_duration(self.offset_s)}"
        elif self.offset_s < 0:
            limit += f" - {format_duration(-self.offset_s)}"
        return f"{left} {op} {limit}"


def _destage(plan: PlanTime) -> str:
    """What the destage adds to the plan, in words (nothing when nothing is dirty)."""
    if plan.destage_s <= 0:
        return ""
    destage = format_duration(plan.destage_s)
    measured = "" if plan.destage_measured else " (not measured yet)"
    if plan.with_destage_s is None:
        return f" + destage {destage}{measured}"
    wait = plan.total_s - plan.plan_s
    if wait > 0:
        return f" + {format_duration(wait)} waiting for destage {destage}{measured}"
    return f" (destage {destage}{measured} beside the guests' shutdown)"


def _amount(metric: str, value: float) -> str:
    if _UNITS.get(metric) == "s":
        return format_duration(value)
    return f"{value:.1f} {_UNITS.get(metric, '')}".rstrip()
