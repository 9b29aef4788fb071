"""Runs written into a journal through the events the executor sends, for the readers that
look back over past runs (what was off before an outage, the report's way back)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from upsguard.events import RunFinished, RunStarted, StepFinished, StepStarted
from upsguard.journal import Journal
from upsguard.models import Direction, ResourceId, RunId, StepId, StepState
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ALREADY = "already off"
"""A step done finding its target there: nothing asked."""
STEP_PREFIX = {Direction.SHUTDOWN: "stop", Direction.STARTUP: "start"}


class JournaledRuns:
    """Runs journaled one hour apart, each step named as the planner names it."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.count = 0

    def run(
        self,
        steps: dict[str, str | StepState],
        kind: RunKind = RunKind.SHUTDOWN,
        outcome: RunOutcome = RunOutcome.DONE,
        restarted: bool = False,
    ) -> RunId:
        """One run; each step (a resource's id) ends ``done`` having asked (any text),
        done finding it there (``ALREADY``), or in the state given. ``restarted``: the run is
        cut by a restart before its steps, and resumed."""
        self.count += 1
        at = T0 + timedelta(hours=self.count)
        spec = RunSpec(RunId(f"{kind}-{self.count}"), kind, RunOrigin.POLICY, "test", at)
        record = self.journal.write.record
        record(RunStarted(at, spec, len(steps)))
        if restarted:
            record(RunFinished(at, spec, RunOutcome.INTERRUPTED, "the service stopped"))
            record(RunStarted(at, spec, len(steps), resumed=True))
        for name, how in steps.items():
            step = StepId(f"{STEP_PREFIX[kind.direction]}:{name}")
            resource = ResourceId(name)
            record(StepStarted(at, spec.id, step, "guest", resource))
            state = how if isinstance(how, StepState) else StepState.DONE
            there = how == ALREADY
            record(
                StepFinished(
                    at, spec.id, step, state, str(how), resource=resource, already_there=there
                )
            )
        record(RunFinished(at, spec, outcome, outcome.value))
        return spec.id
