"""Learned durations in a dry run: the simulated platforms take as long as past runs did.

The plan uses each learned p90 (``Planner(durations=...)``); the simulated targets play the
same p90, so the verdict is the margin of a slow outage, the one the trigger is made for,
not of a typical one. A scenario's own ``steps:`` entry for a resource still wins.
"""

from __future__ import annotations

import math

from upsguard.config.site import SiteConfig
from upsguard.models import Direction, ResourceId, ResourceKind
from upsguard.plugins.platforms.simulated import Behaviour
from upsguard.runbooks.plan import Durations, LearnedDuration


def learned_behaviour(site: SiteConfig, durations: Durations) -> dict[ResourceId, Behaviour]:
    """Per resource with a learned figure: how long one of its targets takes to stop and to
    start (a whole-group figure is shared among the rounds its platform's limit makes)."""
    out: dict[ResourceId, Behaviour] = {}
    for res in site.resources:
        rounds = 1
        if res.kind is ResourceKind.VM_GROUP and res.platform:
            limit = site.platform(res.platform).max_parallel
            rounds = max(1, math.ceil((res.count or 1) / limit))
        stop = _per_target(durations.get((res.id, Direction.SHUTDOWN)), rounds)
        start = _per_target(durations.get((res.id, Direction.STARTUP)), rounds)
        if stop is not None or start is not None:
            out[res.id] = Behaviour(stop_s=stop, start_s=start)
    return out


def _per_target(learned: LearnedDuration | None, rounds: int) -> float | None:
    if learned is None:
        return None
    return learned.p90_s if learned.per_member else learned.p90_s / rounds
