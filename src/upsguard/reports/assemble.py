"""Putting a run's record beside its plan: planned against actual, the critical path, the
steps worth a look, and what the next outage would look like with what was learned.

The input is neutral (``RunFacts``, ``StepRecord``): the controller fills it from the
journal, the simulation from a dry run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime

from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.models import Direction, ResourceId, StepId, StepState
from upsguard.reports.story import (
    Finding,
    Outlook,
    PlanChange,
    RunFacts,
    RunStory,
    StepRecord,
    StepStory,
)
from upsguard.runbooks.plan import Action, Durations, EstimateSource, Plan, Step
from upsguard.runbooks.planner import Planner
from upsguard.runbooks.schedule import scheduled_times

SLOW_RATIO = 1.5
"""A step is slow when it took this many times its estimate..."""
SLOW_MARGIN_S = 10.0
"""...and at least this much longer: a 2 s step that took 4 s is not worth a line."""
CHANGES_SHOWN = 10


def plan_for(planner: Planner, facts: RunFacts) -> Plan:
    """The plan of a run as its planner makes it (a shedding run's ``only`` is its shed set)."""
    only = {ResourceId(r) for r in facts.only} if facts.only is not None else None
    return planner.plan(facts.direction, only)


def run_story(
    facts: RunFacts, records: Sequence[StepRecord], plan: Plan, origin: datetime
) -> RunStory:
    """The run's steps in plan order, each planned against actual; steps the record holds and
    today's plan does not (the site file changed since) come last, without a plan."""
    offset = (facts.started - origin).total_seconds()
    planned = scheduled_times(plan.steps, plan.limits)
    last = _last_attempts(records)
    steps: list[StepStory] = []
    for step in plan.steps:
        start, _ = planned.get(step.id, (0.0, 0.0))
        steps.append(_step_story(step, last.pop(step.id, None), offset + start, origin))
    for record in last.values():
        steps.append(_unplanned_story(record, origin))
    steps = _mark_critical(steps, plan)
    duration = _duration(facts, steps, offset)
    return RunStory(
        facts=facts,
        start_s=offset,
        duration_s=duration,
        planned_s=plan.estimate_s,
        planned_critical_path_s=plan.critical_path_s,
        steps=tuple(steps),
        findings=tuple(findings(steps, facts.direction)),
    )


def _last_attempts(records: Iterable[StepRecord]) -> dict[str, StepRecord]:
    """The attempt that counted for each step: the last one (an abandoned attempt is followed
    by the one that resumed it)."""
    last: dict[str, StepRecord] = {}
    for record in records:
        last[record.step] = record
    return last


def _step_story(
    step: Step, record: StepRecord | None, planned_start: float, origin: datetime
) -> StepStory:
    start, actual = _actual(record, origin)
    return StepStory(
        id=step.id,
        resource=step.resource,
        action=step.action.value,
        description=step.description,
        waits_for=step.waits_for,
        state=record.state if record is not None else None,
        detail=record.detail if record is not None else "",
        planned_start_s=planned_start,
        planned_s=step.estimate_s,
        estimate_source=step.estimate_source,
        start_s=start,
        actual_s=actual,
        tries=record.tries if record is not None else 0,
        fallback_used=record.fallback_used if record is not None else False,
        timeout_s=step.settings.timeout_s if step.settings is not None else None,
    )


def _unplanned_story(record: StepRecord, origin: datetime) -> StepStory:
    start, actual = _actual(record, origin)
    return StepStory(
        id=record.step,
        resource=record.resource or record.step,
        action=record.action,
        description="not in the plan the site file makes today",
        waits_for=(),
        state=record.state,
        detail=record.detail,
        start_s=start,
        actual_s=actual,
        tries=record.tries,
        fallback_used=record.fallback_used,
    )


def _actual(record: StepRecord | None, origin: datetime) -> tuple[float | None, float | None]:
    if record is None or record.started is None:
        return None, None
    start = (record.started - origin).total_seconds()
    if record.ended is None:
        return start, None
    return start, max(0.0, (record.ended - record.started).total_seconds())


def _mark_critical(steps: list[StepStory], plan: Plan) -> list[StepStory]:
    """The chain that decided the run's length: from the step that ended last, back through
    whichever step it waited for ended last. Nothing ran: the plan's own critical path."""
    ends = {
        s.id: s.start_s + s.actual_s
        for s in steps
        if s.start_s is not None and s.actual_s is not None
    }
    chain: set[str] = set()
    if ends:
        by_id = {s.id: s for s in steps}
        current: str | None = max(ends, key=lambda sid: ends[sid])
        while current is not None:
            chain.add(current)
            waits = [w for w in by_id[current].waits_for if w in ends]
            current = max(waits, key=lambda sid: ends[sid]) if waits else None
    else:
        chain = set(plan.critical_path)
    return [_with_critical(s, s.id in chain) for s in steps]


def _with_critical(step: StepStory, critical: bool) -> StepStory:
    return step if step.critical == critical else replace(step, critical=critical)


def _duration(facts: RunFacts, steps: list[StepStory], offset: float) -> float | None:
    if facts.ended is not None:
        return (facts.ended - facts.started).total_seconds()
    ends = [s.start_s + s.actual_s for s in steps if s.start_s is not None and s.actual_s]
    return max(ends) - offset if ends else None


# -- the steps worth a look ----------------------------------------------------------------


def findings(steps: Iterable[StepStory], direction: Direction) -> list[Finding]:
    out: list[Finding] = []
    for step in steps:
        if step.state is StepState.FAILED:
            out.append(_failed(step, direction))
        elif step.fallback_used:
            out.append(_fallback(step))
        elif _slow(step):
            out.append(_slow_finding(step, direction))
    return out


def _slow(step: StepStory) -> bool:
    if step.actual_s is None or step.planned_s is None or step.state is not StepState.DONE:
        return False
    return step.actual_s > step.planned_s * SLOW_RATIO and (
        step.actual_s - step.planned_s >= SLOW_MARGIN_S
    )


_WHY_SLOW = {
    Action.GUEST_SHUTDOWN.value: "look at why its guest shutdown is slow",
    Action.HOST_SHUTDOWN.value: (
        "look at why the host is slow to go down (VMs left on it, maintenance mode)"
    ),
    Action.DEVICE_SHUTDOWN.value: "look at why the device is slow to shut down",
    Action.COMMAND.value: "look at why its command is slow",
    Action.POWER_ON.value: "look at why it is slow to boot and pass its health check",
    Action.HOST_POWER_ON.value: "look at why the host is slow to boot and connect",
}


def _slow_finding(step: StepStory, direction: Direction) -> Finding:
    took, planned = format_duration(step.actual_s or 0.0), format_duration(step.planned_s or 0.0)
    why = _WHY_SLOW.get(step.action, "look at why it is slow")
    source = step.estimate_source
    if source.startswith("p90"):
        text = f"{step.resource} took {took} against its usual {planned} ({source})"
        suggestion = f"slower than in past runs: {why}"
    else:
        what = {
            EstimateSource.ESTIMATE.value: "estimate",
            EstimateSource.PLATFORM.value: "platform's typical",
        }.get(source, "default")
        text = f"{step.resource} took {took} against a {planned} {what}"
        field = "estimate.stop" if direction is Direction.SHUTDOWN else "estimate.start"
        suggestion = (
            f"raise its estimate ({field}: {format_duration(_round_up(step.actual_s or 0.0))}), "
            f"or {why}"
        )
    return Finding(step.id, "slow", text, suggestion)


def _fallback(step: StepStory) -> Finding:
    grace = format_duration(step.timeout_s) if step.timeout_s is not None else "its timeout"
    text = f"{step.resource} did not stop gracefully within {grace} and was powered off"
    suggestion = (
        "look at why its guest shutdown hangs (VMware Tools, a service that blocks the "
        "shutdown), or raise its guest_timeout if it only needs longer"
    )
    return Finding(step.id, "fallback", text, suggestion)


def _failed(step: StepStory, direction: Direction) -> Finding:
    verb = "trigger shutdown" if direction is Direction.SHUTDOWN else "trigger startup"
    return Finding(
        step.id,
        "failed",
        f"{step.resource} failed: {step.detail}",
        f"fix the cause, then try it alone: upsguard {verb} --only {step.resource}",
    )


def _round_up(seconds: float) -> float:
    """A figure a person would write in a site file: the next 10 s, or the next minute."""
    step = 10.0 if seconds < 120 else 60.0
    return float(-(-seconds // step) * step)


# -- what the next outage would look like ------------------------------------------------------


def outlook(
    site: SiteConfig,
    facts: RunFacts,
    used: Plan,
    learned: Durations,
    actual_s: float | None,
) -> Outlook:
    """The plan with every duration learned so far (this run's included) beside the plan of
    the site file alone, and the steps whose estimate moved since the run's own plan."""
    configured = plan_for(Planner(site), facts)
    following = plan_for(Planner(site, durations=learned), facts)
    before = used.by_id()
    changes = [
        PlanChange(
            s.id,
            before[s.id].estimate_s,
            before[s.id].estimate_source,
            s.estimate_s,
            s.estimate_source,
        )
        for s in following.steps
        if s.id in before and abs(s.estimate_s - before[StepId(s.id)].estimate_s) >= 1.0
    ]
    changes.sort(key=lambda c: abs(c.after_s - c.before_s), reverse=True)
    return Outlook(
        direction=facts.direction,
        configured_s=configured.estimate_s,
        learned_s=following.estimate_s,
        learned_critical_path=tuple(following.critical_path),
        learned_critical_path_s=following.critical_path_s,
        actual_s=actual_s,
        learned_steps=sum(1 for s in following.steps if s.estimate_source.startswith("p90")),
        changes=tuple(changes[:CHANGES_SHOWN]),
    )
