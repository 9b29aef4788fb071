"""Running one plan on its own, outside the outage controller (tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from upsguard.clock import Clock
from upsguard.engine.actions import TargetKey, UnderWay, Unfenced
from upsguard.engine.executor import CacheGate, Executor, RunResult
from upsguard.engine.ledger import RunLedger
from upsguard.events import EventSink
from upsguard.models import Direction, PlatformName, StepOutcome
from upsguard.plugins.platforms.base import Platform
from upsguard.runbooks.plan import Plan, Step
from upsguard.runs import RunKind, RunOrigin, RunSpec


def executor_for(
    plan: Plan,
    platforms: Mapping[PlatformName, Platform],
    clock: Clock,
    events: EventSink,
    cache_gate: CacheGate | None = None,
    resumed: bool = False,
    claim: Callable[[RunSpec, Step], Awaitable[bool]] | None = None,
    unfenced: Unfenced | None = None,
    under_way: Mapping[TargetKey, UnderWay] | None = None,
) -> Executor:
    """An executor of ``plan`` as a manual run, with a ledger of its own; ``resumed`` as
    when a restarted service finishes a run; ``claim`` as a controller of a pair claims
    each step (``engine.pair``); ``unfenced`` as such a controller going on without the
    store; ``under_way`` as requests journaled before a restart."""
    ledger = RunLedger(clock, events)
    kind = RunKind.SHUTDOWN if plan.direction is Direction.SHUTDOWN else RunKind.STARTUP
    spec = ledger.new_spec(kind, RunOrigin.MANUAL, "test")
    return Executor(
        plan,
        platforms,
        clock=clock,
        events=events,
        ledger=ledger,
        spec=spec,
        cache_gate=cache_gate,
        resumed=resumed,
        claim=(lambda step: claim(spec, step)) if claim is not None else None,
        unfenced=unfenced,
        under_way=under_way,
    )


def steps_by_id(plan: Plan) -> dict[str, Step]:
    """The plan's steps, looked up by ids written as plain strings (``"stop:db"``), as tests
    write them; ``Plan.by_id`` wants ``StepId``s."""
    return {step.id: step for step in plan.steps}


def outcomes_by_step(result: RunResult) -> dict[str, StepOutcome]:
    """Each step's outcome, looked up by ids written as plain strings, as tests write them."""
    return {step: outcome for step, outcome in result.outcomes.items()}
