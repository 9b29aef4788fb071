"""One source of durations: the simulated platforms play the plan's own figures.

The plan's estimate of each step (learned from past runs, a resource's ``estimate:``, the
simulated platform's timing, or upsguard's default; ``Step.estimate_source`` says which)
is what the runtime trigger counts on. A dry run that played other durations would
predict a run the plan never meant, and the two could disagree without anyone noticing.
So each target of a step takes exactly its step's estimate, per member: a group's step
covers ``ceil(members / max_parallel)`` rounds of one member each. A scenario's
``steps:`` entry (a slow guest, a hang, a refusal) still wins, field by field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta

from upsguard.config.scenario import StepBehaviour
from upsguard.models import Direction, ResourceId
from upsguard.plugins.platforms.simulated import Behaviour
from upsguard.runbooks.plan import Plan, Step
from upsguard.runbooks.planner import Planner


def planned_behaviour(
    planner: Planner, scenario: Mapping[ResourceId, StepBehaviour]
) -> dict[ResourceId, Behaviour]:
    """Per resource: how long one of its targets takes to stop and to start (the plans'
    figures), with the scenario's own behaviour laid over them."""
    stops = _per_target(planner.plan(Direction.SHUTDOWN))
    starts = _per_target(planner.plan(Direction.STARTUP))
    out: dict[ResourceId, Behaviour] = {}
    for rid in stops.keys() | starts.keys() | scenario.keys():
        given = scenario.get(rid)
        out[rid] = Behaviour(
            stop_s=_seconds(given.stop if given else None, stops.get(rid)),
            start_s=_seconds(given.start if given else None, starts.get(rid)),
            hang=given.hang if given else False,
            fail=given.fail if given else None,
            no_tools=given.no_tools if given else False,
        )
    return out


def _per_target(plan: Plan) -> dict[ResourceId, float]:
    out: dict[ResourceId, float] = {}
    for step in plan.steps:
        if step.settings is not None and step.platform is not None:
            out.setdefault(step.resource, member_seconds(step, plan.limits))
    return out


def member_seconds(step: Step, limits: Mapping[str, int]) -> float:
    """One member's share of a step: a group's estimate covers its rounds of members."""
    if step.members <= 1 or step.platform is None:
        return step.estimate_s
    rounds = math.ceil(step.members / max(1, limits.get(step.platform, 1)))
    return step.estimate_s / rounds


def _seconds(given: timedelta | None, planned: float | None) -> float | None:
    return given.total_seconds() if given is not None else planned
