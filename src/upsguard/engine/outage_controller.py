"""The outage loop: poll the UPSes, ask the phase engine, carry out its decisions.

The service (``upsguard run``) calls ``tick`` from its scheduler; the
simulator calls it on a virtual clock. Both get the same policy decisions,
the same executor and the same cache handling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.engine.destage import DestageGate, DestageWatch
from upsguard.engine.executor import Executor, RunResult
from upsguard.errors import UpsguardError
from upsguard.events import EventSink, Notice, PhaseChanged, ReadingTaken
from upsguard.models import (
    CacheMode,
    Phase,
    PlatformName,
    PowerState,
    ResourceId,
    StepId,
    Target,
    UpsName,
)
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.ups.base import UpsSource
from upsguard.policies.phases import Act, Decision, PhaseEngine, PowerView, RunState
from upsguard.policies.power import read_feeds
from upsguard.policies.watch import UpsWatch
from upsguard.runbooks.plan import Direction, Plan, Step
from upsguard.runbooks.planner import build_plan

log = logging.getLogger(__name__)


class RunBusy(UpsguardError):
    """A manual run was asked for while another run is in progress."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a journal needs to rebuild a run after a crash."""

    run: str
    at: datetime
    direction: Direction
    kind: str  # shutdown | shedding | startup
    origin: str  # policy | manual
    reason: str
    only: tuple[ResourceId, ...] | None = None


class RunJournal(Protocol):
    def run_planned(self, spec: RunSpec) -> None:
        """Record the run before its first step starts (synchronously)."""
        ...


@dataclass(frozen=True, slots=True)
class RunProgress:
    """The run in progress, for ``upsguard status``."""

    run: str
    direction: str
    kind: str
    origin: str
    total: int
    finished: dict[str, str]  # step -> state
    running: list[str]
    point_of_no_return: str | None


class OutageLoop:
    def __init__(
        self,
        site: SiteConfig,
        *,
        sources: Mapping[UpsName, UpsSource],
        platforms: Mapping[PlatformName, Platform],
        caches: DestageWatch,
        clock: Clock,
        events: EventSink,
        inventory: Mapping[ResourceId, list[Target]] | None = None,
        journal: RunJournal | None = None,
        shutdown_plan: Plan | None = None,
    ) -> None:
        """``shutdown_plan``: one already built from this site and inventory, not built again."""
        self.site = site
        configs = {u.name: u for u in site.ups}
        self.watches = {
            name: UpsWatch.for_config(src, configs[name], clock)
            if name in configs
            else UpsWatch(src, clock)
            for name, src in sources.items()
        }
        self.sources = dict(sources)
        self.platforms = platforms
        self.caches = caches
        self._clock = clock
        self._events = events
        self._inventory = inventory
        self.engine = PhaseEngine(site.policies, on_change=self._phase_changed)
        self.shutdown_plan = shutdown_plan or build_plan(site, Direction.SHUTDOWN, inventory)
        self.runs = RunState()
        self.executor: Executor | None = None
        self._task: asyncio.Task[RunResult] | None = None
        self.view: PowerView | None = None
        self.results: list[RunResult] = []
        self._sequence = 0
        self._journal = journal
        self.spec: RunSpec | None = None
        self._in_flight: list[Step] = []

    # -- each poll ---------------------------------------------------------------------

    async def tick(self) -> PowerView:
        readings = await asyncio.gather(*(w.poll() for w in self.watches.values()))
        for reading in readings:
            self._events(ReadingTaken(self._clock.now(), reading))
        view = self._view()
        self.view = view
        self._sync_run_state()
        for decision in self.engine.evaluate(view, self.runs, self.plan_seconds()):
            await self._apply(decision)
        return view

    def _view(self) -> PowerView:
        figures = {name: w.figures() for name, w in self.watches.items() if w.last is not None}
        charges = [
            f.reading.charge_pct for f in figures.values() if f.reading.charge_pct is not None
        ]
        return PowerView(
            at_s=self._clock.monotonic(),
            feeds=tuple(read_feeds(self.site.effective_feeds(), figures)),
            min_charge_pct=min(charges) if charges else None,
        )

    def plan_seconds(self) -> float:
        """What the shutdown would take from now: the plan, plus the destage still ahead."""
        eta = self.caches.eta_s() if self.caches.status else 0.0
        return self.shutdown_plan.estimate_s + (eta or 0.0)

    def floor_reached(self) -> bool:
        return self.engine.at_floor

    # -- decisions -----------------------------------------------------------------------

    async def _apply(self, decision: Decision) -> None:
        log.info("%s: %s", decision.act.value, decision.reason)
        if decision.act is Act.CACHES_WRITE_THROUGH:
            if self.caches.names and not self.caches.flipped_at:
                await self.caches.set_mode(CacheMode.WRITE_THROUGH)
        elif decision.act is Act.CACHES_WRITE_BACK:
            if self.caches.names:
                await self.caches.set_mode(CacheMode.WRITE_BACK)
            self.runs = RunState()
        elif decision.act is Act.START_SHEDDING:
            shed = {r.id for r in self.site.resources if r.shed}
            if shed:
                self.runs.shedding_started = True
                await self._start(
                    build_plan(self.site, Direction.SHUTDOWN, self._inventory, shed),
                    "shedding: " + decision.reason,
                    kind="shedding",
                    only=tuple(sorted(shed)),
                )
        elif decision.act is Act.START_SHUTDOWN:
            await self._start(self.shutdown_plan, decision.reason)
        elif decision.act is Act.CANCEL_SHUTDOWN:
            await self._cancel()
            self.runs.cancelled_before_ponr = True
        elif decision.act is Act.CANCEL_STARTUP:
            await self._cancel()
            self.runs.startup_running = False
        elif decision.act is Act.START_STARTUP:
            await self._start(
                build_plan(self.site, Direction.STARTUP, self._inventory), decision.reason
            )

    async def _start(
        self,
        plan: Plan,
        reason: str,
        *,
        kind: str | None = None,
        origin: str = "policy",
        only: tuple[ResourceId, ...] | None = None,
        run_id: str | None = None,
        already_done: Collection[StepId] = (),
    ) -> str:
        await self._cancel()
        self._sequence += 1
        kind = kind or plan.direction.value
        if run_id is None:
            # milliseconds: a run id must not repeat one journaled by an earlier process
            now = self._clock.now()
            run_id = f"{kind}-{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{self._sequence}"
        self.spec = RunSpec(run_id, self._clock.now(), plan.direction, kind, origin, reason, only)
        if self._journal is not None:
            self._journal.run_planned(self.spec)
        gate = DestageGate(self.caches, self.floor_reached)
        self.executor = Executor(
            self.site,
            plan,
            self.platforms,
            clock=self._clock,
            events=self._events,
            run_id=run_id,
            reason=reason,
            cache_gate=gate,
            already_done=already_done,
        )
        if plan.direction is Direction.SHUTDOWN:
            self.runs.something_stopped = True
            self.runs.shutdown_running = plan is self.shutdown_plan
            self.runs.shutdown_finished = False
        else:
            self.runs.startup_running = True
            self.runs.startup_failed = False
        settle, self._in_flight = self._in_flight, []
        if plan.direction is Direction.SHUTDOWN:
            settle = []
        self._task = asyncio.create_task(self._run(self.executor, settle), name=run_id)
        self._task.add_done_callback(self._run_done)
        return run_id

    async def _run(self, executor: Executor, settle: list[Step]) -> RunResult:
        if settle:
            await self._settle(settle)
        return await executor.run()

    async def _settle(self, steps: list[Step]) -> None:
        """A shutdown already asked for cannot be taken back: let it land before starting again,
        or the startup would find a VM still up that goes off a moment later."""
        names = ", ".join(s.resource for s in steps)
        message = f"waiting for the shutdowns already under way ({names}) before starting again"
        self._events(Notice(self._clock.now(), message))
        await asyncio.gather(*(self._settle_one(step) for step in steps))

    async def _settle_one(self, step: Step) -> None:
        platform = self.platforms.get(PlatformName(step.platform or ""))
        if platform is None:
            return
        res = self.site.resource(step.resource)
        wait = res.guest_timeout.total_seconds()
        try:
            targets = list(step.targets) or await platform.resolve(res, direct=step.direct)
            await asyncio.gather(*(platform.wait_for(t, PowerState.OFF, wait) for t in targets))
        except UpsguardError as exc:
            log.warning("%s: could not wait for its shutdown to land: %s", step.id, exc)

    def _run_done(self, task: asyncio.Task[RunResult]) -> None:
        """A run ended by itself; a cancelled one is handled (and recorded) by ``_cancel``."""
        if task.cancelled() or task.exception() is not None or self.executor is None:
            return
        result = task.result()
        if result.state == "cancelled" or result.run != self.executor.run_id:
            return
        self.results.append(result)
        if result.direction is Direction.STARTUP:
            self.runs.startup_running = False
            if result.state != "done" and self.spec is not None and self.spec.only is None:
                self.runs.startup_failed = True
                return
            self.runs.startup_finished = True
            self.runs.something_stopped = False
            self.runs.cancelled_before_ponr = False
        elif self.executor.plan is self.shutdown_plan:
            self.runs.shutdown_running = False
            self.runs.shutdown_finished = True
            if self.view is not None and self.view.on_battery:  # not after a maintenance stop
                asyncio.get_running_loop().create_task(self._ups_commands())

    async def _cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            if self.executor is not None and self.executor.plan.direction is Direction.SHUTDOWN:
                by_id = self.executor.plan.by_id()
                self._in_flight = [by_id[s] for s in sorted(self.executor.running)]
            task.cancel()
            result = await asyncio.gather(task, return_exceptions=True)
            if self.executor is not None and isinstance(result[0], RunResult):
                self.results.append(result[0])
        self.runs.shutdown_running = False
        self.runs.startup_running = False

    def _sync_run_state(self) -> None:
        if self.executor is not None and self.runs.shutdown_running:
            self.runs.point_of_no_return = self.executor.point_of_no_return_passed

    async def _ups_commands(self) -> None:
        """Everything is down: tell each UPS what the site file says (e.g. shutdown.return)."""
        for ups in self.site.ups:
            command = ups.at_shutdown_end.command
            if command is None or ups.name not in self.sources:
                continue
            try:
                await self.sources[ups.name].command(command)
                self._events(Notice(self._clock.now(), f"UPS {ups.name}: sent {command}"))
            except Exception as exc:  # the run is over; report, never crash
                self._events(
                    Notice(
                        self._clock.now(), f"UPS {ups.name}: {command} failed: {exc}", level="error"
                    )
                )

    # -- manual overrides and resume (the service calls these) ------------------------------

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def progress(self) -> RunProgress | None:
        """The run in progress (or the last one), with the steps now running."""
        if self.executor is None or self.spec is None:
            return None
        ex = self.executor
        return RunProgress(
            run=ex.run_id,
            direction=ex.plan.direction.value,
            kind=self.spec.kind,
            origin=self.spec.origin,
            total=len(ex.plan.steps),
            finished={s: o.state.value for s, o in ex.result.outcomes.items()},
            running=sorted(ex.running),
            point_of_no_return=ex.result.point_of_no_return,
        )

    async def trigger(
        self, direction: Direction, only: Collection[ResourceId] | None, reason: str
    ) -> str:
        """A run asked for by a person; the whole site, or only some resources."""
        if self.busy and self.executor is not None:
            raise RunBusy(
                f"run {self.executor.run_id} is in progress: wait for it or 'upsguard abort' first"
            )
        chosen = tuple(sorted(only)) if only else None
        reason = f"manual {direction.value}: {reason}"
        if direction is Direction.SHUTDOWN:
            return await self._trigger_shutdown(chosen, reason)
        plan = build_plan(self.site, Direction.STARTUP, self._inventory, _set(chosen))
        if chosen is None and self.engine.phase is not Phase.RECOVERING:
            self.engine.force(Phase.RECOVERING, reason)
        run = await self._start(plan, reason, origin="manual", only=chosen)
        if chosen is None:
            self.runs.shutdown_manual = False
        return run

    async def _trigger_shutdown(self, only: tuple[ResourceId, ...] | None, reason: str) -> str:
        if only is not None:
            plan = build_plan(self.site, Direction.SHUTDOWN, self._inventory, set(only))
            return await self._start(plan, reason, origin="manual", only=only)
        self.engine.force(Phase.SHUTTING_DOWN, reason)
        if self.caches.names:
            await self.caches.set_mode(CacheMode.WRITE_THROUGH)
        self.runs.shutdown_manual = True
        return await self._start(self.shutdown_plan, reason, origin="manual")

    async def abort(self) -> str | None:
        """Cancel the run in progress; returns its id (None when nothing ran)."""
        if not self.busy or self.executor is None:
            return None
        run = self.executor.run_id
        whole_site = self.runs.shutdown_running
        await self._cancel()
        if whole_site and self.engine.phase is Phase.SHUTTING_DOWN:
            if self.view is not None and self.view.on_battery:
                self.engine.force(Phase.ON_BATTERY, "shutdown aborted")
            else:
                self.runs.cancelled_before_ponr = not self.runs.point_of_no_return
                self.engine.force(Phase.RECOVERING, "shutdown aborted")
        return run

    async def resume(
        self,
        spec: RunSpec,
        done: Collection[StepId],
        point_of_no_return: StepId | None,
    ) -> str:
        """Finish a run a dead controller left: the steps in ``done`` are not run again."""
        only = set(spec.only) if spec.only is not None else None
        if spec.kind == "shutdown" and only is None:
            plan = self.shutdown_plan
            self.runs.shutdown_manual = spec.origin == "manual"
        else:
            plan = build_plan(self.site, spec.direction, self._inventory, only)
        if spec.kind == "shedding":
            self.runs.shedding_started = True
        run = await self._start(
            plan,
            spec.reason,
            kind=spec.kind,
            origin=spec.origin,
            only=spec.only,
            run_id=spec.run,
            already_done=done,
        )
        if self.executor is not None and point_of_no_return is not None:
            self.executor.result.point_of_no_return = point_of_no_return
            self.runs.point_of_no_return = True
        return run

    def _phase_changed(self, old: Phase, new: Phase, reason: str) -> None:
        self._events(PhaseChanged(self._clock.now(), old, new, reason))

    async def close(self) -> None:
        await self._cancel()


def _set(only: tuple[ResourceId, ...] | None) -> set[ResourceId] | None:
    return set(only) if only is not None else None
