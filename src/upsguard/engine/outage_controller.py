"""The outage controller: poll the UPSes, ask the phase engine, carry out its decisions.

The service (``upsguard run``) calls ``tick`` from its poll loop; the simulator calls it
on a virtual clock. Both get the same policy decisions, the same executor and the same
cache handling.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.engine.destage import DestageGate, DestageWatch
from upsguard.engine.end_of_outage import EndOfOutage
from upsguard.engine.executor import Executor, RunResult
from upsguard.engine.ledger import RunLedger
from upsguard.engine.news import PowerNews
from upsguard.errors import TemporaryError, UpsguardError
from upsguard.events import (
    EventSink,
    Notice,
    PhaseChanged,
    ReadingTaken,
)
from upsguard.models import (
    CacheMode,
    Direction,
    Phase,
    PlatformName,
    PowerState,
    ResourceId,
    RunId,
    StepId,
    StepState,
    UpsName,
)
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.ups.base import UpsSource
from upsguard.policies.phases import Act, Decision, PhaseEngine, PowerView
from upsguard.policies.power import feed_name, read_feeds
from upsguard.policies.watch import UpsWatch
from upsguard.runbooks.plan import Plan, Step
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec

log = logging.getLogger(__name__)


REPLAN_WITHIN_S = 15.0
"""How long a run may wait for fresh inventory before it is planned (it goes on without)."""


class RunBusy(TemporaryError):
    """A manual run was asked for while another run is in progress."""


@dataclass(frozen=True, slots=True)
class RunProgress:
    """The run in progress, for ``upsguard status`` and metrics."""

    spec: RunSpec
    total: int
    finished: dict[StepId, StepState]
    running: list[StepId]
    point_of_no_return: StepId | None


class OutageController:
    """Polls the UPSes, asks the phase engine, and carries out its decisions: flips caches,
    starts and cancels runs. The service ticks it from its poll loop; the simulator ticks
    it on a virtual clock. Runs are owned by the ``ledger``; this class starts and stops
    them and remembers only the executor of the one in progress."""

    def __init__(
        self,
        site: SiteConfig,
        *,
        sources: Mapping[UpsName, UpsSource],
        platforms: Mapping[PlatformName, Platform],
        caches: DestageWatch,
        clock: Clock,
        events: EventSink,
        planner: Planner | None = None,
        ledger: RunLedger | None = None,
        dry_run: bool = False,
        replan: Callable[[], Awaitable[Planner | None]] | None = None,
    ) -> None:
        """``planner``: one already made for this site and inventory, not made again.
        ``dry_run``: the simulator's controller (no health probe touches the network).
        ``replan``: asked for a fresh planner (live inventory) before a policy run is planned,
        within ``REPLAN_WITHIN_S``; without an answer the run goes with the plan it has."""
        self._dry_run = dry_run
        self._replan = replan
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
        self.ledger = ledger or RunLedger(clock, events)
        self.engine = PhaseEngine(site.policies, on_change=self._phase_changed)
        self.planner = planner or Planner(site)
        self.shutdown_plan = self.planner.plan(Direction.SHUTDOWN)
        self.feeds = {feed_name(f, i): f for i, f in enumerate(site.effective_feeds())}
        self._all_resources = frozenset(r.id for r in site.resources)
        self._scoped: dict[tuple[str, ...], Plan] = {}
        self.executor: Executor | None = None
        self._task: asyncio.Task[RunResult] | None = None
        self.view: PowerView | None = None
        self._in_flight: list[Step] = []
        self._news = PowerNews(self.feeds, clock, events)
        self._end = EndOfOutage(site, sources, clock, events)
        self._acting = asyncio.Lock()
        """Held while runs are started or stopped: a policy's decision and a person's
        override never interleave (one would abandon the run the other just began)."""
        self._cache_reading: asyncio.Task[Any] | None = None

    # -- each poll ---------------------------------------------------------------------

    async def tick(self) -> PowerView:
        """One poll of every UPS, then the decisions it calls for. Nothing here raises: a
        decision that fails is that decision's failure, reported, and the next tick derives
        what is wanted from the state again (a shutdown the phase wants and no run
        carries is started then)."""
        readings = await asyncio.gather(*(w.poll() for w in self.watches.values()))
        for reading in readings:
            self._events(ReadingTaken(self._clock.now(), reading))
        self._news.readings(readings, self.watches.values())
        view = self._view()
        self._news.feeds(view)
        self.view = view
        self._read_caches(view)
        async with self._acting:
            for decision in self.engine.evaluate(view, self.ledger.site(), self.plan_seconds()):
                try:
                    await self._apply(decision)
                except Exception as exc:  # one decision's failure never stops the others
                    log.exception("%s failed", decision.act.value)
                    message = f"{decision.act.value} failed: {type(exc).__name__}: {exc}"
                    self._events(Notice(self._clock.now(), message, level="error"))
        return view

    def _read_caches(self, view: PowerView) -> None:
        """On battery, the caches' dirty data decides when the shutdown must start: read them
        every poll (in the background: a slow cache never delays a decision)."""
        if not view.on_battery or not self.caches.names:
            return
        if self._cache_reading is None or self._cache_reading.done():
            self._cache_reading = asyncio.create_task(self.caches.poll(), name="cache reading")

    def alerts(self) -> list[str]:
        """What a person should know now: UPSes that cannot be read."""
        return [
            f"UPS {name} cannot be read: {w.last_error}"
            for name, w in self.watches.items()
            if w.last_error is not None
        ]

    def _view(self) -> PowerView:
        figures = {name: w.figures() for name, w in self.watches.items() if w.last is not None}
        charges = [
            f.reading.charge_pct for f in figures.values() if f.reading.charge_pct is not None
        ]
        return PowerView(
            at_s=self._clock.monotonic(),
            feeds=tuple(
                read_feeds(
                    self.site.effective_feeds(),
                    figures,
                    self.site.policies.on_lost_contact_while_on_line,
                )
            ),
            min_charge_pct=min(charges) if charges else None,
        )

    def plan_seconds(self) -> dict[str, float]:
        """Per feed, what its shutdown would take from now: the plan of what it powers (and
        what needs that), plus the destage still ahead in its data path."""
        out = {}
        for name in self.feeds:
            plan = self.plan_for((name,))
            eta = self.caches.eta_s(plan.caches) if self.caches.status else 0.0
            out[name] = plan.estimate_s + (eta or 0.0)
        return out

    def use_planner(self, planner: Planner) -> None:
        """Plan from now on with ``planner`` (fresh inventory, learned durations); a run in
        progress keeps the plan it started with."""
        self.planner = planner
        self.shutdown_plan = planner.plan(Direction.SHUTDOWN)
        self._scoped.clear()

    def plan_for(self, feeds: tuple[str, ...] | None) -> Plan:
        """The shutdown plan of some feeds: what they power and what needs that; the site's
        plan when they power everything. Worked out once per set of feeds."""
        if feeds is None:
            return self.shutdown_plan
        key = tuple(sorted(feeds))
        if key not in self._scoped:
            scope = self.scope(key)
            plan = (
                self.shutdown_plan
                if scope is None
                else self.planner.plan(Direction.SHUTDOWN, scope)
            )
            self._scoped[key] = plan
        return self._scoped[key]

    def scope(self, feeds: tuple[str, ...] | None) -> set[ResourceId] | None:
        """The resources the feeds power; None when that is every resource."""
        if feeds is None:
            return None
        powered = {rid for name in feeds for rid in self.feeds[name].powers}
        return None if powered >= self._all_resources else powered

    def floor_reached(self) -> bool:
        return self.engine.at_floor

    # -- decisions -----------------------------------------------------------------------

    async def _apply(self, decision: Decision) -> None:
        log.info("%s: %s", decision.act.value, decision.reason)
        if decision.act in (Act.START_SHUTDOWN, Act.START_SHEDDING, Act.START_STARTUP):
            await self._fresh_plans()
        if decision.act is Act.CACHES_WRITE_THROUGH:
            at_risk = (
                self.caches.names
                if decision.feeds is None
                else self.plan_for(decision.feeds).caches
            )
            flip = [c for c in at_risk if c not in self.caches.flipped_at]
            if flip:
                await self.caches.set_mode(CacheMode.WRITE_THROUGH, flip)
        elif decision.act is Act.CACHES_WRITE_BACK:
            flipped = list(self.caches.flipped_at)
            if flipped:
                await self.caches.set_mode(CacheMode.WRITE_BACK, flipped)
        elif decision.act is Act.START_SHEDDING:
            scope = self.scope(decision.feeds)
            shed = {
                r.id for r in self.site.resources if r.shed and (scope is None or r.id in scope)
            }
            if shed:
                spec = self.ledger.new_spec(
                    RunKind.SHEDDING, RunOrigin.POLICY, decision.reason, shed, decision.feeds
                )
                await self._start(self.planner.plan(Direction.SHUTDOWN, shed), spec)
        elif decision.act is Act.START_SHUTDOWN:
            plan = self.plan_for(decision.feeds)
            scope = self.scope(decision.feeds)
            spec = self.ledger.new_spec(
                RunKind.SHUTDOWN, RunOrigin.POLICY, decision.reason, scope, decision.feeds
            )
            await self._start(plan, spec)
        elif decision.act in (Act.CANCEL_SHUTDOWN, Act.CANCEL_STARTUP):
            await self._stop_run(RunOutcome.CANCELLED)
        elif decision.act is Act.START_STARTUP:
            spec = self.ledger.new_spec(RunKind.STARTUP, RunOrigin.POLICY, decision.reason)
            await self._start(self.planner.plan(Direction.STARTUP), spec)

    async def _fresh_plans(self) -> None:
        """Where the VMs are now decides which hosts wait on which cache: ask once more."""
        if self._replan is None:
            return
        try:
            async with asyncio.timeout(REPLAN_WITHIN_S):
                planner = await self._replan()
        except TimeoutError:
            planner = None
        if planner is not None:
            self.use_planner(planner)

    async def _start(
        self,
        plan: Plan,
        spec: RunSpec,
        already_done: Collection[StepId] = (),
        resumed: bool = False,
    ) -> RunId:
        await self._stop_run(RunOutcome.ABANDONED)
        executor = Executor(
            plan,
            self.platforms,
            clock=self._clock,
            events=self._events,
            ledger=self.ledger,
            spec=spec,
            cache_gate=DestageGate(self.caches, self.floor_reached),
            already_done=already_done,
            resumed=resumed,
            before_step=self._before_step,
            dry_run=self._dry_run,
        )
        self.executor = executor
        executor.begin()
        settle, self._in_flight = self._in_flight, []
        prelude = None
        if settle and plan.direction is Direction.STARTUP:
            prelude = functools.partial(self._settle, settle)
        self._task = asyncio.create_task(executor.run(prelude), name=spec.id)
        self._task.add_done_callback(functools.partial(self._run_done, executor))
        return spec.id

    async def _settle(self, steps: list[Step]) -> None:
        """A shutdown already asked for cannot be taken back: let it land before starting again,
        or the startup would find a VM still up that goes off a moment later."""
        names = ", ".join(s.resource for s in steps)
        message = f"waiting for the shutdowns already under way ({names}) before starting again"
        self._events(Notice(self._clock.now(), message))
        await asyncio.gather(*(self._settle_one(step) for step in steps))

    async def _settle_one(self, step: Step) -> None:
        platform = self.platforms.get(PlatformName(step.platform or ""))
        if platform is None or step.settings is None:
            return
        settings = step.settings
        try:
            targets = list(step.targets) or await platform.resolve(
                settings.resource, direct=step.direct
            )
            await asyncio.gather(
                *(platform.wait_for(t, PowerState.OFF, settings.timeout_s) for t in targets)
            )
        except UpsguardError as exc:
            log.warning("%s: could not wait for its shutdown to land: %s", step.id, exc)

    async def _before_step(self, step: Step) -> str | None:
        """The controller's own machine goes down last, and takes upsguard with it: only
        once something will bring it back (see ``engine.end_of_outage``); the UPS commands
        of the end of an outage go out before its step, or they never would."""
        executor = self.executor
        if step.settings is None or not step.settings.resource.runs_upsguard or executor is None:
            return None
        stopped = {s.resource for s in executor.plan.steps}
        stay = await self._end.own_machine(
            executor.spec, step.settings.resource, stopped, self.view
        )
        return stay.reason if stay is not None else None

    def _run_done(self, executor: Executor, task: asyncio.Task[RunResult]) -> None:
        """A shutdown that ended by itself on battery: tell the UPSes what the site file says
        (unless the controller's own machine's step did already)."""
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        spec = result.run
        ended = result.outcome in (RunOutcome.DONE, RunOutcome.FAILED)
        if ended and spec.kind is RunKind.SHUTDOWN and spec.concerns_the_site:
            stopped = {s.resource for s in executor.plan.steps}
            asyncio.get_running_loop().create_task(self._end.tell_ups(spec, stopped, self.view))

    async def _stop_run(self, outcome: RunOutcome) -> RunResult | None:
        """Stop the run in progress, ending it with ``outcome``; its shutdowns in flight are
        remembered so a startup that follows lets them land first."""
        task, self._task = self._task, None
        executor = self.executor
        if task is None or task.done() or executor is None:
            return None
        if executor.plan.direction is Direction.SHUTDOWN:
            by_id = executor.plan.by_id()
            self._in_flight = [by_id[s] for s in sorted(executor.running)]
        executor.stop(outcome)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return executor.result

    # -- manual overrides and resume (the service calls these) ------------------------------

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def progress(self) -> RunProgress | None:
        """The run in progress, with the steps now running."""
        ex = self.executor
        if ex is None or not self.busy:
            return None
        return RunProgress(
            spec=ex.spec,
            total=len(ex.plan.steps),
            finished={s: o.state for s, o in ex.result.outcomes.items()},
            running=sorted(ex.running),
            point_of_no_return=ex.point_of_no_return,
        )

    async def wait_idle(self) -> RunResult | None:
        """Wait until the run in progress (if any) has ended; its result."""
        task = self._task
        if task is None:
            return None
        await asyncio.gather(task, return_exceptions=True)
        return self.executor.result if self.executor is not None else None

    async def trigger(
        self, direction: Direction, only: Collection[ResourceId] | None, reason: str
    ) -> RunId:
        """A run asked for by a person; the whole site, or only some resources."""
        async with self._acting:
            return await self._trigger(direction, only, reason)

    async def _trigger(
        self, direction: Direction, only: Collection[ResourceId] | None, reason: str
    ) -> RunId:
        if self.busy and self.executor is not None:
            raise RunBusy(
                f"run {self.executor.run_id} is in progress: wait for it or 'upsguard abort' first"
            )
        chosen = set(only) if only else None
        kind = RunKind.SHUTDOWN if direction is Direction.SHUTDOWN else RunKind.STARTUP
        spec = self.ledger.new_spec(kind, RunOrigin.MANUAL, f"manual {kind}: {reason}", chosen)
        if chosen is not None:
            return await self._start(self.planner.plan(direction, chosen), spec)
        if direction is Direction.SHUTDOWN:
            self.engine.force(Phase.SHUTTING_DOWN, spec.reason)
            if self.caches.names:
                await self.caches.set_mode(CacheMode.WRITE_THROUGH)
            return await self._start(self.shutdown_plan, spec)
        if self.engine.phase is not Phase.RECOVERING:
            self.engine.force(Phase.RECOVERING, spec.reason)
        return await self._start(self.planner.plan(Direction.STARTUP), spec)

    async def abort(self) -> RunId | None:
        """Cancel the run in progress (it ends ``aborted``); returns its id (None when
        nothing ran)."""
        async with self._acting:
            return await self._abort()

    async def _abort(self) -> RunId | None:
        if not self.busy or self.executor is None:
            return None
        run = self.executor.spec.id
        whole_site = self.ledger.site().shutdown_running
        await self._stop_run(RunOutcome.ABORTED)
        if whole_site and self.engine.phase is Phase.SHUTTING_DOWN:
            on_battery = self.view is not None and self.view.on_battery
            self.engine.force(
                Phase.ON_BATTERY if on_battery else Phase.RECOVERING, "shutdown aborted"
            )
        return run

    async def resume(self, spec: RunSpec, done: Collection[StepId]) -> RunId:
        """Finish a run a dead or stopped controller left: the steps in ``done`` are not run
        again; every other step first reads its target's real state, and waits for a task
        of its platform still under way rather than asking again."""
        if spec.kind is RunKind.SHUTDOWN and spec.only is None:
            plan = self.shutdown_plan
        else:
            plan = self.planner.plan(spec.direction, set(spec.only) if spec.only else None)
        return await self._start(plan, spec, already_done=done, resumed=True)

    def _phase_changed(self, old: Phase, new: Phase, reason: str) -> None:
        self._events(PhaseChanged(self._clock.now(), old, new, reason))

    async def interrupt(self) -> None:
        """The service is stopping: the run in progress ends ``interrupted``, its running
        steps too, and nothing that waits on them starts; the next start resumes it."""
        await self._stop_run(RunOutcome.INTERRUPTED)
