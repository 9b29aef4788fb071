"""The executor: carries one plan out against real (or simulated) platforms.

One executor serves the service and the simulator: it waits through asyncio only, so
under the simulator's virtual-time loop the same code runs in no wall time. Each step
starts as soon as every step it waits for is finished and its platform has a free slot;
its outcome is reported (journaled) before any step that depends on it starts. The run's
life (started, point of no return, finished) is told to the run ledger, which owns it.

Stopping a run (``stop``) cancels its running steps: on a power-back cancel or an abort
they end ``cancelled``; when the service itself stops they end ``interrupted`` and no
step that waits on them starts, so the next start re-checks them in order. The requests its
steps had sent that have not landed yet (``under_way``) go to the run that follows, whose
steps wait for them rather than asking again.

In a controller pair each step is claimed just before it acts (``claim``: the leader
records it started in the shared store, fenced by its term). A refused claim means another
controller acts now: the step ends ``interrupted``, and so does the run, for the leader to
resume.

The first host or storage step of a shutdown (its point of no return) may be held back by
``before_point_of_no_return``: the outage controller holds it while the mains are there, so
that a returning mains that stays can still cancel the run.

A run's scope may grow while it runs (``widen``: a second feed's trigger): the steps it has
running or done go on as they are, and the new ones start as soon as what they wait for is
finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from upsguard.clock import Clock
from upsguard.engine.actions import StepRunner, TargetKey, UnderWay, Unfenced
from upsguard.engine.ledger import RunLedger
from upsguard.engine.slots import Slots
from upsguard.errors import LeadershipLost
from upsguard.events import (
    EventSink,
    RequestFailed,
    StepFinished,
    StepStarted,
    StepWaiting,
    TargetAsked,
)
from upsguard.models import Direction, PlatformName, ResourceId, StepId, StepOutcome, StepState
from upsguard.plugins.platforms.base import Platform
from upsguard.runbooks.plan import Action, Plan, Step
from upsguard.runs import RunOutcome, RunSpec

log = logging.getLogger(__name__)


class Deposed(Exception):
    """A step's claim was refused: this controller no longer acts, the run ends interrupted."""


class CacheGate(Protocol):
    """What a step in a cache's data path waits on (``engine.destage.DestageGate``)."""

    async def wait_clean(self, step: Step) -> None:
        """Return once the caches in the step's data path are clean, or when the battery
        or a destage timeout says to go on regardless (journaled as a risk)."""
        ...


@dataclass
class RunResult:
    run: RunSpec
    outcome: RunOutcome | None = None  # None while it runs
    outcomes: dict[StepId, StepOutcome] = field(default_factory=dict)

    @property
    def failed(self) -> list[StepOutcome]:
        return [o for o in self.outcomes.values() if o.state is StepState.FAILED]


class Executor:
    def __init__(
        self,
        plan: Plan,
        platforms: Mapping[PlatformName, Platform],
        *,
        clock: Clock,
        events: EventSink,
        ledger: RunLedger,
        spec: RunSpec,
        cache_gate: CacheGate | None = None,
        already_done: Mapping[StepId, StepState] | None = None,
        resumed: bool = False,
        before_step: Callable[[Step], Awaitable[str | None]] | None = None,
        dry_run: bool = False,
        under_way: Mapping[TargetKey, UnderWay] | None = None,
        claim: Callable[[Step], Awaitable[bool]] | None = None,
        unfenced: Unfenced | None = None,
        before_point_of_no_return: Callable[[Step], Awaitable[None]] | None = None,
    ) -> None:
        """``already_done``: steps a resumed run finished before, and how (done or skipped).
        ``resumed``: the run was cut short before; its steps look for the platform's own
        tasks still under way and wait for them instead of asking again.
        ``before_step``: awaited just before a step acts (after its cache gate); a reason it
        returns skips the step (upsguard's own machine staying up); ``LeadershipLost``: as a
        claim refused (the pair's term ended while it acted).
        ``dry_run``: the simulator's run; health checks do not probe the network.
        ``under_way``: requests of runs before this one that have not landed yet.
        ``claim``: awaited before ``before_step`` (after the cache gate); False: another
        controller of the pair acts now, and this run ends interrupted.
        ``unfenced``: this controller's side of a pair, for when it goes on without the store
        (``StepRunner``).
        ``before_point_of_no_return``: awaited (after the cache gate, before the claim) by a
        shutdown's host and storage steps while the run has not crossed its point of no
        return; it returns when they may cross it."""
        self.plan = plan
        self.spec = spec
        self._clock = clock
        self._events = events
        self._ledger = ledger
        self._gate = cache_gate
        self._before_step = before_step
        self._claim = claim
        self._before_point_of_no_return = before_point_of_no_return
        slots = {PlatformName(p): Slots(n) for p, n in plan.limits.items()}
        self._runner = StepRunner(
            platforms,
            clock,
            plan.direction,
            slots,
            network_probes=not dry_run,
            resumed=resumed,
            run=spec.id,
            under_way=under_way,
            on_request=self._asked,
            on_failed=self._ask_failed,
            on_wait=self._waits,
            unfenced=unfenced,
        )
        self.result = RunResult(spec)
        self._steps = plan.by_id()
        self._already_states = {
            step: state for step, state in (already_done or {}).items() if step in self._steps
        }
        self._already = set(self._already_states)
        self._dependents = plan.dependents()
        self._missing = {s.id: len(s.waits_for) for s in plan.steps}
        self._tasks: dict[StepId, asyncio.Task[None]] = {}
        self._all_finished: asyncio.Future[None] | None = None
        self.running: set[StepId] = set()
        self._stopping: RunOutcome | None = None
        self._interrupted_by: str | None = None
        self._begun = False
        self._unusable: set[StepId] = set()  # failed, or not started because of a failure

    @property
    def run_id(self) -> str:
        return self.spec.id

    @property
    def point_of_no_return(self) -> StepId | None:
        record = self._ledger.get(self.spec.id)
        return record.point_of_no_return if record is not None else None

    @property
    def under_way(self) -> dict[TargetKey, UnderWay]:
        """Requests accepted (by this run's steps, or taken over from runs before) that have
        not been seen to land."""
        return dict(self._runner.under_way)

    def _asked(self, request: UnderWay) -> None:
        target = request.target
        self._events(
            TargetAsked(
                self._clock.now(),
                request.run,
                request.step,
                target.platform,
                target.name,
                target.kind,
                request.wanted,
                request.process,
            )
        )

    def _ask_failed(self, request: UnderWay) -> None:
        target = request.target
        self._events(
            RequestFailed(
                self._clock.now(), request.run, request.step, target.platform, target.name
            )
        )

    def _waits(self, step: StepId, reason: str) -> None:
        self._events(StepWaiting(self._clock.now(), self.spec.id, step, reason))

    def widen(self, plan: Plan, spec: RunSpec, reason: str) -> None:
        """The run's scope grew: carry ``plan`` out from here. Steps finished, running or
        waiting for their turn go on as they are (none is cancelled, none asked twice); the
        new ones start as soon as what they wait for is finished."""
        known = plan.by_id()
        kept = [s for s in self.plan.steps if s.id not in known]  # a step the new plan lost
        self.plan = replace(plan, steps=(*plan.steps, *kept))
        self.spec = spec
        self._steps = self.plan.by_id()
        self._dependents = self.plan.dependents()
        finished = set(self.result.outcomes) | self._already
        self._missing = {
            s.id: sum(1 for w in s.waits_for if w not in finished) for s in self.plan.steps
        }
        self._ledger.widened(spec, len(self.plan.steps), reason)
        if self._all_finished is None or self._stopping is not None:
            return  # not begun yet (its start launches what is ready), or ending
        for step in self.plan.steps:
            ready = self._missing[step.id] == 0
            if ready and step.id not in finished and step.id not in self._tasks:
                self._launch(step.id)

    def stop(self, outcome: RunOutcome) -> None:
        """Say how the run ends when its task is cancelled next: ``cancelled``, ``aborted`` or
        ``interrupted``. Cancelling the task without this ends it ``cancelled``."""
        self._stopping = outcome

    def begin(self) -> None:
        """The run exists from now on: the ledger knows it (and the phase engine sees it
        running) even while it waits for something before its first step."""
        if not self._begun:
            self._begun = True
            self._ledger.started(self.spec, len(self.plan.steps))

    async def run(self) -> RunResult:
        """Carry the plan out."""
        self.begin()
        self._all_finished = asyncio.get_running_loop().create_future()
        try:
            for sid in self._already:
                for dep in self._dependents[sid]:
                    self._missing[dep] -= 1
            for step in self.plan.steps:
                if self._missing[step.id] == 0 and step.id not in self._already:
                    self._launch(step.id)
            self._check_all_finished()
            await self._all_finished
            outcome = RunOutcome.FAILED if self.result.failed else RunOutcome.DONE
            detail = self._summary()
        except asyncio.CancelledError:
            outcome = self._stopping or RunOutcome.CANCELLED
            self._stopping = outcome
            await self._stop_all(outcome)
            detail = self._summary()
        except Deposed as exc:
            outcome = RunOutcome.INTERRUPTED
            await self._stop_all(outcome)
            detail = f"{exc}; {self._summary()}"
        except Exception as exc:  # a bug: the run ends failed, said and journaled, never hidden
            log.exception("run %s failed unexpectedly", self.spec.id)
            self._stopping = RunOutcome.FAILED
            await self._stop_all(RunOutcome.FAILED)
            outcome, detail = RunOutcome.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        self.result.outcome = outcome
        self._ledger.finished(self.spec.id, outcome, detail)
        return self.result

    def _launch(self, sid: StepId) -> None:
        """A step gets a task only once everything it waits for is finished."""
        self._tasks[sid] = asyncio.create_task(self._step(self._steps[sid]), name=sid)

    def _release_dependents(self, sid: StepId) -> None:
        for dep in self._dependents[sid]:
            self._missing[dep] -= 1
            if self._missing[dep] == 0 and dep not in self._already and self._stopping is None:
                self._launch(dep)

    def _check_all_finished(self) -> None:
        pending = len(self.plan.steps) - len(self._already) - len(self.result.outcomes)
        if pending <= 0 and self._all_finished is not None and not self._all_finished.done():
            self._all_finished.set_result(None)

    async def _stop_all(self, outcome: RunOutcome) -> None:
        """Running steps end cancelled (or interrupted); a cancelled run's steps that never
        started end cancelled too, an interrupted run's are left for the resume."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if outcome is RunOutcome.INTERRUPTED:
            return
        now = self._clock.now()
        for step in self.plan.steps:
            if step.id not in self.result.outcomes and step.id not in self._already:
                self._finish(StepOutcome(step.id, StepState.CANCELLED, now, now, "run cancelled"))

    def known_down(self) -> set[ResourceId]:
        """The resources a shutdown is known to have stopped: each of their steps ended done
        (seen off, or its command succeeded) with no target left running, in this run or in
        the run it resumes. A step failed, skipped, cancelled, interrupted or not run yet
        leaves its resource not known off, whatever the plan says."""
        states: dict[ResourceId, list[bool]] = {}
        for step in self.plan.steps:
            if step.settings is None:
                continue
            outcome = self.result.outcomes.get(step.id)
            if outcome is not None:
                down = outcome.state is StepState.DONE and not outcome.left_running
            else:
                down = self._already_states.get(step.id) is StepState.DONE
            states.setdefault(step.resource, []).append(down)
        return {resource for resource, downs in states.items() if all(downs)}

    def _summary(self) -> str:
        counts = Counter(outcome.state for outcome in self.result.outcomes.values())
        return ", ".join(f"{n} {state.value}" for state, n in sorted(counts.items()))

    async def _step(self, step: Step) -> None:
        try:
            blocked = self._blocked_by(step)
            if blocked:
                self._finish(self._skipped(step, f"not started: {blocked} failed"))
                return
            if step.caches and self._gate is not None:
                await self._gate_caches(step, self._gate)
            if self._before_point_of_no_return is not None and self._would_cross(step):
                await self._before_point_of_no_return(step)
            if self._claim is not None and not await self._claim(step):
                self._deposed(step)
                return
            if self._before_step is not None:
                try:
                    why = await self._before_step(step)
                except LeadershipLost:
                    self._deposed(step)
                    return
                if why is not None:
                    self._finish(self._skipped(step, why))
                    return
            self._mark_point_of_no_return(step)
            outcome = await self._perform(step)
            if outcome.state is StepState.INTERRUPTED:  # its term ended before it asked
                self._deposed(step, outcome)
                return
            self._finish(outcome)
        except asyncio.CancelledError:
            now = self._clock.now()
            if self._stopping is RunOutcome.INTERRUPTED:
                why = self._interrupted_by or "the service stopped"
                self._finish(StepOutcome(step.id, StepState.INTERRUPTED, now, now, why))
            else:
                self._finish(StepOutcome(step.id, StepState.CANCELLED, now, now, "run cancelled"))
            raise
        except Exception as exc:  # a bug, or the journal failing: end the run loudly
            if self._all_finished is not None and not self._all_finished.done():
                self._all_finished.set_exception(exc)
        finally:
            del self._tasks[step.id]

    def _deposed(self, step: Step, outcome: StepOutcome | None = None) -> None:
        """The claim was refused, or the term ended before the step asked its platform
        (``outcome``): nothing more starts, and the run ends interrupted."""
        self._stopping = RunOutcome.INTERRUPTED
        self._interrupted_by = "another controller of the pair acts now"
        if self._all_finished is not None and not self._all_finished.done():
            self._all_finished.set_exception(Deposed(self._interrupted_by))
        now = self._clock.now()
        why = "not started: another controller of the pair acts now"
        self._finish(outcome or StepOutcome(step.id, StepState.INTERRUPTED, now, now, why))

    def _blocked_by(self, step: Step) -> StepId | None:
        """Startup steps (and shutdown with step_failure: stop) do not run after a failure."""
        if self._unusable and self.plan.stop_on_failure:
            for dep in step.waits_for:
                if dep in self._unusable:
                    self._unusable.add(step.id)
                    return dep
        return None

    async def _gate_caches(self, step: Step, gate: CacheGate) -> None:
        reason = "waiting for " + ", ".join(step.caches) + " to be clean"
        self._events(StepWaiting(self._clock.now(), self.spec.id, step.id, reason))
        await gate.wait_clean(step)

    def _would_cross(self, step: Step) -> bool:
        """The step would be the run's point of no return (none was crossed yet)."""
        crosses = self.plan.direction is Direction.SHUTDOWN and step.is_point_of_no_return
        return crosses and self.point_of_no_return is None

    def _mark_point_of_no_return(self, step: Step) -> None:
        if self.plan.direction is Direction.SHUTDOWN and step.is_point_of_no_return:
            self._ledger.point_of_no_return(self.spec.id, step.id)

    async def _perform(self, step: Step) -> StepOutcome:
        started = self._clock.now()
        if step.action is Action.BARRIER:
            return StepOutcome(step.id, StepState.DONE, started, started, "barrier passed")
        self.running.add(step.id)
        self._events(
            StepStarted(
                started, self.spec.id, step.id, step.action, step.resource, member=step.member
            )
        )
        try:
            return await self._runner.run(step, started)
        finally:
            self.running.discard(step.id)

    def _skipped(self, step: Step, why: str) -> StepOutcome:
        now = self._clock.now()
        return StepOutcome(step.id, StepState.SKIPPED, now, now, why)

    def _finish(self, outcome: StepOutcome) -> None:
        if outcome.step in self.result.outcomes:
            return
        self.result.outcomes[outcome.step] = outcome
        if outcome.state is StepState.FAILED:
            self._unusable.add(outcome.step)
        self._events(
            StepFinished(
                outcome.ended,
                self.spec.id,
                outcome.step,
                outcome.state,
                outcome.detail,
                outcome.attempts,
                outcome.fallback_used,
                self._steps[outcome.step].resource,
                outcome.already_there,
                member=self._steps[outcome.step].member,
            )
        )
        self._release_dependents(outcome.step)
        self._check_all_finished()
