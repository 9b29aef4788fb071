"""A startup run against the site before the outage: what came back, what was left off as
it was, and what differs.

The site before the outage is what the runs that stopped it read (``found_off``, from
``journal.as_before``): a resource they found off was off; any other may have been running.
So a resource whose startup did not end done is a difference unless it was read off before
and its step was skipped (left off), never assumed to be as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from upsguard.models import ResourceId, RunId, StepState
from upsguard.reports.story import Difference, StepStory, WayBack

STARTED = "started"
NOT_BACK = "not_back"


def way_back(steps: Sequence[StepStory], found_off: Mapping[ResourceId, RunId]) -> WayBack:
    """``steps``: the startup's, in plan order (a resource's steps taken together);
    ``found_off``: each resource read off before the outage, with the run that read it."""
    by_resource: dict[str, list[StepStory]] = {}
    for step in steps:
        by_resource.setdefault(step.resource, []).append(step)
    back: list[str] = []
    left_off: list[str] = []
    differences: list[Difference] = []
    for resource, its in by_resource.items():
        states = {s.state for s in its}
        found_by = found_off.get(ResourceId(resource))
        if states == {StepState.DONE}:
            if found_by is None:
                back.append(resource)
            else:
                differences.append(Difference(resource, STARTED, found_off_by=found_by))
        elif found_by is not None and states == {StepState.SKIPPED}:
            left_off.append(resource)
        else:
            first = next(s for s in its if s.state is not StepState.DONE)
            differences.append(Difference(resource, NOT_BACK, _why(first)))
    return WayBack(tuple(back), tuple(left_off), tuple(differences))


def _why(step: StepStory) -> str:
    if step.state is None:
        return "never started"
    return f"{step.state.value}: {step.detail}" if step.detail else step.state.value
