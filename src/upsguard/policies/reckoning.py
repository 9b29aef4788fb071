"""Judging a policy's condition over one feed, keeping the figures (``decisions.Reckoning``)."""

from __future__ import annotations

from upsguard.config.conditions import Condition
from upsguard.decisions import NO_PLAN, PlanTime, Reckoning


def reckon(
    condition: Condition,
    feed: str,
    values: dict[str, float | None],
    flags: set[str],
    plan: PlanTime = NO_PLAN,
) -> Reckoning:
    """Judge ``condition`` over one feed's values and flags, keeping the figures."""
    holds = condition.holds(values, flags, plan.total_s)
    if condition.metric is None:
        return Reckoning(condition.text, feed, holds)
    limit = condition.threshold + (plan.total_s if condition.plus_plan else 0.0)
    return Reckoning(
        condition.text,
        feed,
        holds,
        metric=condition.metric,
        op=condition.op,
        value=values.get(condition.metric),
        limit=limit,
        plan=plan if condition.plus_plan else None,
        offset_s=condition.threshold if condition.plus_plan else 0.0,
    )
