"""The executor: runs a plan against real (or simulated) platforms.

One executor serves the service and the simulator: it waits through asyncio
only, so under the simulator's virtual-time loop the same code runs in no
wall time. Each step starts as soon as every step it waits for is finished
and its platform has a free slot; its outcome is reported (journaled) before
any step that depends on it starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.engine.actions import StepRunner
from upsguard.engine.slots import Slots
from upsguard.events import (
    EventSink,
    PointOfNoReturn,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
    StepWaiting,
)
from upsguard.models import PlatformName, StepId, StepOutcome, StepState
from upsguard.plugins.platforms.base import Platform
from upsguard.runbooks.plan import Action, Direction, Plan, Step

log = logging.getLogger(__name__)


class CacheGate:
    """What a step in a cache's data path waits on; see ``runbooks.destage``."""

    async def wait_clean(self, step: Step, run: str) -> None:  # pragma: no cover - protocol
        raise NotImplementedError


@dataclass
class RunResult:
    run: str
    direction: Direction
    state: str  # done | failed | cancelled
    outcomes: dict[StepId, StepOutcome] = field(default_factory=dict)
    point_of_no_return: StepId | None = None

    @property
    def failed(self) -> list[StepOutcome]:
        return [o for o in self.outcomes.values() if o.state is StepState.FAILED]


class Executor:
    def __init__(
        self,
        site: SiteConfig,
        plan: Plan,
        platforms: Mapping[PlatformName, Platform],
        *,
        clock: Clock,
        events: EventSink,
        run_id: str,
        reason: str = "",
        cache_gate: CacheGate | None = None,
        already_done: Collection[StepId] = (),
        on_point_of_no_return: Callable[[], None] | None = None,
    ) -> None:
        self.plan = plan
        self.run_id = run_id
        self._site = site
        self._clock = clock
        self._events = events
        self._reason = reason
        self._gate = cache_gate
        self._on_ponr = on_point_of_no_return
        self._runner = StepRunner(site, platforms, clock, plan.direction)
        self._slots = {PlatformName(p): Slots(n) for p, n in plan.limits.items()}
        self._runner.slots = self._slots
        self.result = RunResult(run_id, plan.direction, "running")
        self._steps = plan.by_id()
        self._already = set(already_done) & self._steps.keys()
        self._dependents = plan.dependents()
        self._missing = {s.id: len(s.waits_for) for s in plan.steps}
        self._tasks: dict[StepId, asyncio.Task[None]] = {}
        self._all_finished: asyncio.Future[None] | None = None
        self.running: set[StepId] = set()
        self._cancelling = False
        self._unusable: set[StepId] = set()  # failed, or not started because of a failure
        self._stop_on_failure = (
            plan.direction is Direction.STARTUP or site.policies.step_failure == "stop"
        )

    @property
    def point_of_no_return_passed(self) -> bool:
        return self.result.point_of_no_return is not None

    async def run(self) -> RunResult:
        self._events(
            RunStarted(
                self._clock.now(),
                self.run_id,
                self.plan.direction.value,
                len(self.plan.steps),
                self._reason,
            )
        )
        self._all_finished = asyncio.get_running_loop().create_future()
        for sid in self._already:
            for dep in self._dependents[sid]:
                self._missing[dep] -= 1
        for step in self.plan.steps:
            if self._missing[step.id] == 0 and step.id not in self._already:
                self._launch(step.id)
        self._check_all_finished()
        cancelled = False
        try:
            await self._all_finished
        except asyncio.CancelledError:
            cancelled = True
            await self._cancel_all()
        self.result.state = self._final_state(cancelled)
        self._events(
            RunFinished(
                self._clock.now(),
                self.run_id,
                self.plan.direction.value,
                self.result.state,
                self._summary(),
            )
        )
        return self.result

    def _launch(self, sid: StepId) -> None:
        """A step gets a task only once everything it waits for is finished."""
        self._tasks[sid] = asyncio.create_task(self._step(self._steps[sid]), name=sid)

    def _release_dependents(self, sid: StepId) -> None:
        for dep in self._dependents[sid]:
            self._missing[dep] -= 1
            if self._missing[dep] == 0 and dep not in self._already and not self._cancelling:
                self._launch(dep)

    def _check_all_finished(self) -> None:
        pending = len(self.plan.steps) - len(self._already) - len(self.result.outcomes)
        if pending <= 0 and self._all_finished is not None and not self._all_finished.done():
            self._all_finished.set_result(None)

    async def _cancel_all(self) -> None:
        """Running steps end as cancelled; so do the ones that never started."""
        self._cancelling = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        now = self._clock.now()
        for step in self.plan.steps:
            if step.id not in self.result.outcomes and step.id not in self._already:
                self._finish(StepOutcome(step.id, StepState.CANCELLED, now, now, "run cancelled"))

    def _final_state(self, cancelled: bool) -> str:
        if cancelled:
            return "cancelled"
        return "failed" if self.result.failed else "done"

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
            self._mark_point_of_no_return(step)
            self._finish(await self._perform(step))
        except asyncio.CancelledError:
            now = self._clock.now()
            self._finish(StepOutcome(step.id, StepState.CANCELLED, now, now, "run cancelled"))
            raise
        except Exception as exc:  # a bug, or the journal failing: end the run loudly
            if self._all_finished is not None and not self._all_finished.done():
                self._all_finished.set_exception(exc)
        finally:
            del self._tasks[step.id]

    def _blocked_by(self, step: Step) -> StepId | None:
        """Startup steps (and shutdown with step_failure: stop) do not run after a failure."""
        if self._unusable and self._stop_on_failure:
            for dep in step.waits_for:
                if dep in self._unusable:
                    self._unusable.add(step.id)
                    return dep
        return None

    async def _gate_caches(self, step: Step, gate: CacheGate) -> None:
        self._events(
            StepWaiting(
                self._clock.now(),
                self.run_id,
                step.id,
                "waiting for " + ", ".join(step.caches) + " to be clean",
            )
        )
        await gate.wait_clean(step, self.run_id)

    def _mark_point_of_no_return(self, step: Step) -> None:
        if self.plan.direction is not Direction.SHUTDOWN or self.point_of_no_return_passed:
            return
        if step.is_point_of_no_return:
            self.result.point_of_no_return = step.id
            self._events(PointOfNoReturn(self._clock.now(), self.run_id, step.id))
            if self._on_ponr is not None:
                self._on_ponr()

    async def _perform(self, step: Step) -> StepOutcome:
        started = self._clock.now()
        if step.action is Action.BARRIER:
            return StepOutcome(step.id, StepState.DONE, started, started, "barrier passed")
        self.running.add(step.id)
        self._events(StepStarted(started, self.run_id, step.id, step.action))
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
                self.run_id,
                outcome.step,
                outcome.state,
                outcome.detail,
                outcome.attempts,
                outcome.fallback_used,
            )
        )
        self._release_dependents(outcome.step)
        self._check_all_finished()
