"""When a feed's shutdown will start, as its triggers stand now (``decisions.Outlook``).

``status`` shows each trigger with when it fires; an alert says the first of them ("the
shutdown starts at 12m left, in about 11m"). Both come from ``fires_in`` here, so the two
never tell different times. A trigger fires at the present drain: a runtime falls a second a
second, a charge at the measured rate, the time on battery grows a second a second; anything
else (a flag, a drain not measured yet) has no time: unknown, never a guess.
"""

from __future__ import annotations

from upsguard.config.conditions import Condition
from upsguard.config.policies import PoliciesConfig
from upsguard.decisions import Outlook, PlanTime, Reckoning
from upsguard.policies.phases import Values, condition_inputs
from upsguard.policies.power import FeedReading
from upsguard.policies.reckoning import reckon


def fires_in(condition: Condition, judged: Reckoning, values: Values) -> float | None:
    """Seconds until ``condition`` holds at the present drain: 0 when it holds now, None
    when it cannot be told (a flag, a figure not known, a drain not measured)."""
    if judged.holds:
        return 0.0
    value, limit = judged.value, judged.limit
    if value is None or limit is None:
        return None
    if condition.metric == "runtime" and condition.op in ("<", "<="):
        return value - limit
    if condition.metric == "charge" and condition.op in ("<", "<="):
        rate = values.get("depletion")
        return (value - limit) / rate * 60.0 if rate else None
    if condition.metric == "on_battery_for":
        return limit - value
    return None


def outlook(policies: PoliciesConfig, feed: FeedReading, plan: PlanTime) -> Outlook:
    """The feed's shutdown as its triggers see it now: due, due at a known time (the soonest
    trigger), or not foreseeable (no trigger has a figure to count down)."""
    values, flags = condition_inputs(feed)
    timed: list[tuple[float, Condition, Reckoning]] = []
    for condition in policies.shutdown.when_any:
        judged = reckon(condition, feed.name, values, flags, plan)
        when = fires_in(condition, judged, values)
        if judged.holds:
            return _due(feed, condition.text, judged)
        if when is not None:
            timed.append((when, condition, judged))
    if _at_floor(policies, feed):
        return Outlook(feed.runtime_s, due_now=True, condition="critical floor", fires_in_s=0.0)
    if not timed:
        return Outlook(feed.runtime_s)
    when, condition, judged = min(timed, key=lambda t: t[0])
    return Outlook(
        feed.runtime_s,
        condition=condition.text,
        metric=judged.metric,
        limit=judged.limit,
        fires_in_s=max(0.0, when),
    )


def _due(feed: FeedReading, condition: str, judged: Reckoning) -> Outlook:
    return Outlook(
        feed.runtime_s,
        due_now=True,
        condition=condition,
        metric=judged.metric,
        limit=judged.limit,
        fires_in_s=0.0,
    )


def _at_floor(policies: PoliciesConfig, feed: FeedReading) -> bool:
    """As the phase engine's critical floor: below it, the shutdown starts even during a hold."""
    floor = policies.critical_floor
    charge, runtime = feed.charge_pct, feed.runtime_s
    return (charge is not None and charge < floor.charge_below) or (
        runtime is not None and runtime < floor.runtime_below.total_seconds()
    )
