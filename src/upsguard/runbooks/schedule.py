"""Duration figures of a plan: its critical path and a schedule under parallelism limits.

The critical path (longest chain of estimated durations) is the lower bound
of any run; the list schedule honours each platform's ``max_parallel`` and is
what the runtime trigger ``runtime < plan + margin`` compares against.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

from upsguard.models import CacheName, StepId
from upsguard.runbooks.plan import Plan, Step


def _unit_seconds(step: Step, limits: Mapping[str, int]) -> float:
    """One member's duration (a group's estimate covers ceil(count/limit) rounds)."""
    if step.members <= 1 or step.platform is None:
        return step.estimate_s
    rounds = math.ceil(step.members / max(1, limits.get(step.platform, 1)))
    return step.estimate_s / rounds


def critical_path(
    steps: Sequence[Step], limits: Mapping[str, int]
) -> tuple[tuple[StepId, ...], float]:
    """Longest chain by estimated duration; ``steps`` must be in topological order."""
    finish: dict[StepId, float] = {}
    via: dict[StepId, StepId | None] = {}
    for step in steps:
        prev: StepId | None = None
        start = 0.0
        for w in step.waits_for:
            if prev is None or finish[w] > start:
                prev, start = w, finish[w]
        finish[step.id] = start + step.estimate_s
        via[step.id] = prev
    if not finish:
        return (), 0.0
    last: StepId | None = max(finish, key=lambda s: finish[s])
    total = finish[last] if last is not None else 0.0
    path: list[StepId] = []
    while last is not None:
        path.append(last)
        last = via[last]
    return tuple(reversed(path)), total


def list_schedule(
    steps: Sequence[Step],
    limits: Mapping[str, int],
    not_before: Mapping[StepId, float] | None = None,
) -> float:
    """Makespan when each step starts as soon as it may and a platform slot is free (and not
    before its ``not_before``)."""
    times = scheduled_times(steps, limits, not_before)
    return max((end for _, end in times.values()), default=0.0)


def finish_with_destage(plan: Plan, clean_in: Mapping[CacheName, float]) -> float:
    """How long the plan takes when the caches become clean in ``clean_in`` seconds from its
    start: the destage runs beside the guests' shutdown, and only the steps in a cache's data
    path wait for it (the longer of the path to them and the destage, then the rest)."""
    not_before = {
        step.id: max(clean_in.get(c, 0.0) for c in step.caches)
        for step in plan.steps
        if step.caches
    }
    if not any(not_before.values()):
        return plan.estimate_s
    return list_schedule(plan.steps, plan.limits, not_before)


def after_point_of_no_return(plan: Plan) -> float:
    """How long the plan takes from its first host or storage step (its point of no return)
    to its end; 0 when it has none."""
    times = scheduled_times(plan.steps, plan.limits)
    crossing = [times[s.id][0] for s in plan.steps if s.is_point_of_no_return]
    if not crossing:
        return 0.0
    return max(end for _, end in times.values()) - min(crossing)


def scheduled_times(
    steps: Sequence[Step],
    limits: Mapping[str, int],
    not_before: Mapping[StepId, float] | None = None,
) -> dict[StepId, tuple[float, float]]:
    """Each step's planned start and end (seconds from the run's start) in that schedule:
    the planned side of a retrospective's timeline. ``not_before``: the earliest start of
    some steps (a host waiting for its caches to be clean)."""
    earliest = not_before or {}
    index = {s.id: i for i, s in enumerate(steps)}
    remaining = [len(s.waits_for) for s in steps]
    dependents: list[list[int]] = [[] for _ in steps]
    for i, s in enumerate(steps):
        for w in s.waits_for:
            dependents[index[w]].append(i)
    slots: dict[str, list[float]] = {p: [0.0] * max(1, n) for p, n in limits.items()}
    ready_at = [earliest.get(s.id, 0.0) for s in steps]
    ready = [(ready_at[i], i) for i, s in enumerate(steps) if not s.waits_for]
    heapq.heapify(ready)
    times: dict[StepId, tuple[float, float]] = {}
    while ready:
        at, i = heapq.heappop(ready)
        end = _place(steps[i], at, slots, limits)
        times[steps[i].id] = (end - steps[i].estimate_s if steps[i].members <= 1 else at, end)
        for dep in dependents[i]:
            if end > ready_at[dep]:
                ready_at[dep] = end
            remaining[dep] -= 1
            if remaining[dep] == 0:
                heapq.heappush(ready, (ready_at[dep], dep))
    return times


def _place(
    step: Step, at: float, slots: dict[str, list[float]], limits: Mapping[str, int]
) -> float:
    heap = slots.get(step.platform) if step.platform is not None else None
    if heap is None:
        return at + step.estimate_s
    if step.members <= 1:  # most steps: one target, one slot
        finish = max(heap[0], at) + step.estimate_s
        heapq.heapreplace(heap, finish)
        return finish
    unit = _unit_seconds(step, limits)
    end = at
    for _ in range(step.members):
        free = heapq.heappop(heap)
        finish = max(free, at) + unit
        heapq.heappush(heap, finish)
        end = max(end, finish)
    return end
