"""The outage controller: poll the UPSes, ask the phase engine, carry out its decisions.

The service (``upsguard run``) calls ``tick`` from its poll loop; the simulator calls it
on a virtual clock. Both get the same policy decisions, the same executor and the same
cache handling.

In a controller pair (``engine.pair``) both controllers poll and evaluate, so the standby
knows the phase and is ready; only the one that may act applies decisions and claims each
step before it acts. A standby that must go on alone (the store silent while a shutdown is
due) resumes the run the shared ledger holds rather than starting a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from upsguard.clock import Clock
from upsguard.config.resources import ResourceConfig
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.decisions import PlanTime, Reckoning
from upsguard.engine.actions import TargetKey, UnderWay
from upsguard.engine.destage import DestageGate, DestageWatch
from upsguard.engine.end_of_outage import EndOfOutage
from upsguard.engine.executor import Executor, RunResult
from upsguard.engine.ledger import RunLedger
from upsguard.engine.pair import Pair, SharedRun
from upsguard.engine.power_notices import PowerNotices
from upsguard.errors import RunBusy, ServiceStopping
from upsguard.events import (
    EventSink,
    Notice,
    PhaseChanged,
    ReadingTaken,
    RunFinished,
    StepWaiting,
)
from upsguard.models import (
    CacheName,
    Direction,
    LinkState,
    Phase,
    PlatformName,
    ResourceId,
    ResourceKind,
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
from upsguard.runbooks.schedule import finish_with_destage
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunRecord, RunSpec

log = logging.getLogger(__name__)


PAIR_POWEROFF = (
    "finished by the last controller's own poweroff (every other step was done; the "
    "controllers' machines went down last, as planned)"
)

REPLAN_WITHIN_S = 15.0
"""How long a run may wait for fresh inventory before it is planned (it goes on without)."""


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
        pair: Pair | None = None,
        found_off: Callable[[RunId], Mapping[ResourceId, RunId]] | None = None,
    ) -> None:
        """``planner``: one already made for this site and inventory, not made again.
        ``dry_run``: the simulator's controller (no health probe touches the network).
        ``replan``: asked for a fresh planner (live inventory) before a policy run is planned,
        within ``REPLAN_WITHIN_S``; without an answer the run goes with the plan it has.
        ``pair``: this controller's side of an active/standby pair; decisions are applied and
        steps act only while it may act.
        ``found_off``: the VMs the outage found already off, asked by a whole-site startup
        (``journal.as_before``); None: every VM of the plan is started."""
        self._pair = pair
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
        self._under_way: dict[TargetKey, UnderWay] = {}
        """Requests of runs that ended (cancelled, aborted, superseded) not seen to land: the
        next run's steps wait for them instead of asking again."""
        self._found_off = found_off
        self._left_off: Mapping[ResourceId, RunId] = {}
        """The VMs the startup in progress leaves off, and the run that found each off."""
        self._journal_left: SharedRun | None = None
        """A pair's controller: the run its journal left in progress at its start, resumed
        when it leads only if the shared ledger never held it (``left_in_journal``)."""
        self._news = PowerNotices(self.feeds, clock, events, site.policies)
        self._end = EndOfOutage(site, sources, clock, events, self._claim_ups_command)
        self._acting = asyncio.Lock()
        """Held while runs are started or stopped: a policy's decision and a person's
        override never interleave (one would abandon the run the other just began)."""
        self._stopped = False
        """The service stops (``interrupt``): no run starts any more, whatever a poll still
        under way or a person asks."""
        self._swapped_out = False
        """A controller of a newer site file took over (``take_over``): a person's command
        that waited for ``_acting`` here must not start or stop a run behind its back."""
        self._cache_reading: asyncio.Task[Any] | None = None
        self._ended_shutdown: tuple[RunSpec, frozenset[ResourceId]] | None = None
        """The last shutdown that ended by itself, and what it is known to have stopped."""
        self._viewed = asyncio.Event()
        """Set (and replaced) at each poll: a step waiting on the power sees the new view."""

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
        view = self.read_view()
        self._news.feeds(view, self.plan_seconds)
        self.view = view
        self._viewed.set()
        self._viewed = asyncio.Event()
        self._read_caches(view)
        async with self._acting:
            if self._stopped:
                return view
            decisions = self.engine.evaluate(view, self.ledger.site(), self.plan_seconds())
            if self._pair is not None and not self._pair.may_act():
                decisions = await self._not_acting(self._pair, decisions)
            for decision in decisions:
                try:
                    await self._apply(decision)
                except ServiceStopping:  # stopped meanwhile: the next start decides again
                    return view
                except Exception as exc:  # one decision's failure never stops the others
                    log.exception("%s failed", decision.act.value)
                    message = f"{decision.act.value} failed: {type(exc).__name__}: {exc}"
                    self._events(Notice(self._clock.now(), message, level="error"))
            if self._pair is not None:
                self._settle_debts(self._pair)
            if self.may_act:
                await self._keep_caches(view)
                await self._last_moment(view)
            if self._pair is not None and not self.busy:
                self._pair.rejoin()  # finished alone, the run over: back once the store answers
        return view

    @property
    def phase(self) -> Phase:
        """The phase the site is in."""
        return self.engine.phase

    @property
    def held(self) -> str | None:
        """The reason of a person's hold, while one defers the automatic actions."""
        return self.engine.held

    @property
    def at_floor(self) -> bool:
        """A feed at its critical floor: a hold no longer defers the shutdown."""
        return self.engine.at_floor

    def hold(self, reason: str) -> None:
        """A person's hold: automatic actions wait (above the critical floor)."""
        self.engine.hold(reason)

    def release(self) -> None:
        self.engine.release()

    @property
    def may_act(self) -> bool:
        """Alone, or the controller of a pair that leads (or finishes alone)."""
        return self._pair is None or self._pair.may_act()

    async def _not_acting(self, pair: Pair, decisions: list[Decision]) -> list[Decision]:
        """The standby (or a fenced leader) applies nothing, unless a shutdown is due while
        the store is silent: never missing a shutdown outranks never acting twice. It then
        goes on alone with the run the shared ledger holds, or starts the one due."""
        due = [d for d in decisions if d.act is Act.START_SHUTDOWN]
        runs = self.ledger.site()
        shared = runs.shutdown_running
        if self.busy or not (due or shared):
            return []
        if not due and runs.active is not None and self._stale_on_mains(runs.active.spec):
            return []  # a shutdown the store holds in progress, its outage over: not adopted
        reason = due[0].reason if due else "the shared ledger holds a shutdown in progress"
        if not pair.act_alone(reason):
            return []
        run = pair.shared_run()
        if run is not None and run.spec.kind is RunKind.SHUTDOWN:
            await self._adopt(run)
            return []
        return due

    def _settle_debts(self, pair: Pair) -> None:
        """A cache this controller took out of write-back while it led (or went on alone) is
        its debt; once it no longer leads, it cannot return it. The debt goes to the leader
        through the controllers' views: the leader takes what the others owe, and the others
        drop what the leader took (a leader's own debts are in the shared ledger)."""
        if pair.may_act():
            self.caches.owe(CacheName(c) for c in pair.take_debts())
        else:
            self.caches.disown(CacheName(c) for c in pair.debts_taken())

    async def _keep_caches(self, view: PowerView) -> None:
        """Level-triggered like the runs: on battery the caches at risk stay in write-through
        (one that refused is asked again), and back to normal what upsguard took out of
        write-back goes back (likewise) once no run needs it clean (a person's partial
        shutdown flips what gates its hosts)."""
        phase = self.engine.phase
        if phase in (Phase.ON_BATTERY, Phase.SHEDDING, Phase.SHUTTING_DOWN) and view.on_battery:
            feeds = tuple(f.name for f in view.at_risk)
            await self.caches.write_through(self._caches_of(feeds))
        elif phase is Phase.NORMAL and self.caches.owed and not self.busy:
            await self.caches.restore()

    def _caches_of(self, feeds: tuple[str, ...] | None) -> list[CacheName]:
        """The caches in the data path of what the feeds power (all of them: every cache)."""
        return self.caches.names if feeds is None else list(self.plan_for(feeds).caches)

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

    def read_view(self) -> PowerView:
        """The power as the watches read it now, deciding nothing. ``tick`` decides on it;
        ``status`` shows it beside the same watches' UPS lines, so a UPS read between two
        ticks is never shown stale in its own line and on line in its feed's."""
        figures = {name: w.figures() for name, w in self.watches.items() if w.last is not None}
        charges = [
            f.reading.charge_pct
            for f in figures.values()
            if f.reading.link is LinkState.OK and f.reading.charge_pct is not None
        ]
        every_charge_read = len(charges) == len(self.watches)
        return PowerView(
            at_s=self._clock.monotonic(),
            feeds=tuple(
                read_feeds(
                    self.site.effective_feeds(),
                    figures,
                    self.site.policies.on_lost_contact_while_on_line,
                )
            ),
            min_charge_pct=min(charges) if charges and every_charge_read else None,
        )

    def plan_seconds(self) -> dict[str, PlanTime]:
        """Per feed, what its shutdown would take from now: the plan of what it powers (and
        what needs that), its host steps waiting for the destage still ahead in their data
        path while the guests shut down."""
        out = {}
        for name in self.feeds:
            plan = self.plan_for((name,))
            if not self.caches.status or not plan.caches:
                out[name] = PlanTime(plan.estimate_s)
                continue
            eta, measured = self.caches.eta(plan.caches)
            clean_in = {cache: self.caches.eta([cache])[0] for cache in plan.caches}
            placed = finish_with_destage(plan, clean_in)
            out[name] = PlanTime(plan.estimate_s, eta, measured, with_destage_s=placed)
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
            await self.caches.write_through(self._caches_of(decision.feeds))
        elif decision.act is Act.CACHES_WRITE_BACK:
            await self.caches.restore()
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
            await self._shut_down(decision.feeds, decision.reason)
        elif decision.act in (Act.CANCEL_SHUTDOWN, Act.CANCEL_STARTUP):
            await self._stop_run(RunOutcome.CANCELLED)
        elif decision.act is Act.START_STARTUP:
            spec = self.ledger.new_spec(RunKind.STARTUP, RunOrigin.POLICY, decision.reason)
            await self._start(self.planner.plan(Direction.STARTUP), spec)

    async def _shut_down(self, feeds: tuple[str, ...] | None, reason: str) -> None:
        """Shut the feeds down. A policy's shutdown already running for other feeds grows to
        cover these too: nothing it has running or done is cancelled or asked again."""
        plan = self.plan_for(feeds)
        scope = self.scope(feeds)
        executor = self.executor
        running = executor is not None and self.busy and executor.spec.kind is RunKind.SHUTDOWN
        if running and executor is not None and executor.spec.origin is RunOrigin.POLICY:
            only = tuple(sorted(scope)) if scope is not None else None
            executor.widen(plan, replace(executor.spec, only=only, feeds=feeds), reason)
            return
        spec = self.ledger.new_spec(RunKind.SHUTDOWN, RunOrigin.POLICY, reason, scope, feeds)
        await self._start(plan, spec)

    async def _fresh_plans(self) -> None:
        """Where the VMs are now decides which hosts wait on which cache: ask once more,
        unless the battery is at the critical floor (nothing waits there)."""
        if self._replan is None or self.engine.at_floor:
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
        already_done: Mapping[StepId, StepState] | None = None,
        resumed: bool = False,
    ) -> RunId:
        await self._stop_run(RunOutcome.ABANDONED)
        if self._stopped:  # stopped while this run was being planned
            raise ServiceStopping(f"the service is stopping: run {spec.id} is not started")
        self._close_superseded(spec.id)  # one run at a time: this one goes on now
        self._ended_shutdown = None
        self._left_off = self._as_before(plan, spec)
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
            under_way=self._take_under_way(),
            claim=self._claim if self._pair is not None else None,
            unfenced=self._pair,
            before_point_of_no_return=self._hold_point_of_no_return,
        )
        self.executor = executor
        executor.begin()
        self._task = asyncio.create_task(executor.run(), name=spec.id)
        self._task.add_done_callback(functools.partial(self._run_done, executor))
        return spec.id

    def _as_before(self, plan: Plan, spec: RunSpec) -> Mapping[ResourceId, RunId]:
        """A whole-site startup brings the site back as it was: the VMs the outage found
        already off stay off (``policies.startup.guests``). A person's startup of named
        resources starts them all."""
        whole_site = plan.direction is Direction.STARTUP and spec.only is None
        as_before = self.site.policies.startup.guests == "as_before"
        if self._found_off is None or not whole_site or not as_before:
            return {}
        return self._found_off(spec.id)

    async def _hold_point_of_no_return(self, step: Step) -> None:
        """A policy's shutdown does not cross its point of no return while the mains are
        there (every feed it covers read on mains): the step waits. If the mains stay for
        ``power_returns.online_for`` the phase engine cancels the run, as before the point of
        no return; if they fail again the step goes on. A person's shutdown, and a site file
        that says ``before_point_of_no_return: finish``, do not wait."""
        told = False
        while self._mains_hold_back():
            if not told and self.executor is not None:
                told = True
                online_for = format_duration(self.site.policies.power_returns.online_for)
                reason = (
                    "the mains are back: the point of no return waits for them to stay "
                    f"{online_for} (the run is cancelled) or to fail again"
                )
                spec = self.executor.spec
                self._events(StepWaiting(self._clock.now(), spec.id, step.id, reason))
            await self._viewed.wait()

    def _mains_hold_back(self) -> bool:
        """The run in progress is a policy's shutdown that a returning mains may cancel, and
        every feed it covers is read on mains now."""
        executor, view = self.executor, self.view
        if executor is None or view is None:
            return False
        spec = executor.spec
        cancels = self.site.policies.power_returns.before_point_of_no_return == "cancel"
        if spec.kind is not RunKind.SHUTDOWN or spec.origin is not RunOrigin.POLICY or not cancels:
            return False
        covered = [f for f in view.feeds if spec.feeds is None or f.name in spec.feeds]
        return bool(covered) and all(f.mains_seen for f in covered)

    def _controller_machine(self, step: Step) -> bool:
        """The step stops a machine running upsguard: this one's, or its pair's."""
        if step.settings is None:
            return False
        peer = self.site.ha.peer_machine if self.site.ha is not None else None
        return step.settings.resource.runs_upsguard or step.resource == peer

    async def _before_step(self, step: Step) -> str | None:
        """The controllers' machines go down last, and take upsguard with them: only once
        something will bring them back (see ``engine.end_of_outage``); the UPS commands of
        the end of an outage go out before the first of them, or they never would. A
        startup leaves off the VMs the outage found already off (``_stays_off``)."""
        executor = self.executor
        if step.settings is None or executor is None:
            return None
        if executor.plan.direction is Direction.STARTUP:
            return self._stays_off(step.settings.resource)
        if not self._controller_machine(step):
            return None
        while self.view is None:  # resumed before the first poll: the power is not known yet
            await self._viewed.wait()
        return await self._end.own_machine(
            executor.spec, step.settings.resource, executor.known_down(), self.view
        )

    def _stays_off(self, resource: ResourceConfig) -> str | None:
        """Why a startup leaves ``resource`` off: a VM the outage found already off."""
        found_by = self._left_off.get(resource.id)
        if found_by is None or resource.kind is not ResourceKind.VM:
            return None
        return (
            f"left off: {resource.id} was already off when run {found_by} came to stop it "
            "(startup.guests: as_before)"
        )

    async def _claim(self, step: Step) -> bool:
        """A pair's fence before a step acts. At the first of the controllers' machines the
        leader hands the run over instead (the other stops this machine, then its own after
        the UPS command), unless the mains are there (both stay up); a controller handed the
        run that cannot read the UPSes the end commands hands it back (once)."""
        pair, executor = self._pair, self.executor
        if pair is None or executor is None:
            return True
        spec = executor.spec
        if executor.plan.direction is not Direction.SHUTDOWN or not self._controller_machine(step):
            return await pair.claim(spec, step.id, step.resource)
        unread = self._unread_commanded()
        if unread and pair.should_hand_back(spec.id):
            message = (
                f"run {spec.id}: {pair.me} cannot read UPS {', '.join(unread)}, whose command "
                "ends the outage: it hands the run back to the controller that handed it over"
            )
            self._events(Notice(self._clock.now(), message, level="warning"))
            await pair.hand_back(spec, step.id)
            return False
        if pair.should_hand_over(spec.id) and not self._end.mains_there(step.resource, self.view):
            await pair.hand_over(spec, step.id)
            return False
        return await pair.claim(spec, step.id, step.resource)

    async def _claim_ups_command(self, spec: RunSpec, ups: UpsName) -> bool:
        """A pair's fence before a UPS's end command, as before a step (``Pair.claim_ups_command``):
        False when another controller leads, and the command is not sent."""
        return self._pair is None or await self._pair.claim_ups_command(spec, ups)

    def _unread_commanded(self) -> list[UpsName]:
        """The UPSes told something at the end of an outage (``at_shutdown_end``) that this
        controller cannot read now: it could neither tell them, nor tell whether the mains
        are there."""
        commanded = {u.name for u in self.site.ups if u.at_shutdown_end.command is not None}
        return sorted(
            name
            for name, watch in self.watches.items()
            if name in commanded and (watch.last is None or watch.last.link is not LinkState.OK)
        )

    def _run_done(self, executor: Executor, task: asyncio.Task[RunResult]) -> None:
        """A shutdown that ended by itself on battery: tell the UPSes what the site file says
        (unless the controller's own machine's step did already), cutting nothing that is
        not known off: what a failed run left running keeps its power until the battery's
        last moment (``_last_moment``)."""
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        spec = result.run
        ended = result.outcome in (RunOutcome.DONE, RunOutcome.FAILED)
        if ended and spec.kind is RunKind.SHUTDOWN and spec.concerns_the_site:
            down = frozenset(executor.known_down())
            self._ended_shutdown = (spec, down)
            asyncio.get_running_loop().create_task(self._end.tell_ups(spec, down, self.view))

    @property
    def waits_for_the_floor(self) -> bool:
        """The last shutdown ended with UPSes not told (they would have cut what is not known
        off): they are told at the critical floor (``_last_moment``)."""
        ended = self._ended_shutdown
        return ended is not None and bool(self._end.untold(ended[0]))

    async def _last_moment(self, view: PowerView) -> None:
        """At the critical floor, after a shutdown ended with resources not known off, the
        UPSes not told yet are told now all the same: the batteries drop those resources in
        moments either way, and the load cycle is what brings the site back. Level-triggered
        (every tick at the floor), told once per UPS; each cut is named as an error first."""
        ended = self._ended_shutdown
        if ended is None or self.busy or not view.on_battery or not self.engine.at_floor:
            return
        spec, down = ended
        await self._end.tell_ups(spec, down, view, last_moment=True)

    def _take_under_way(self) -> dict[TargetKey, UnderWay]:
        """What the run before left under way (stopped, or ended by itself a moment ago),
        and what a controller before this one journaled: the next run waits for it."""
        if self.executor is not None:
            self._under_way.update(self.executor.under_way)
        taken, self._under_way = self._under_way, {}
        return taken

    async def _stop_run(self, outcome: RunOutcome) -> RunResult | None:
        """Stop the run in progress, ending it with ``outcome``; its requests not seen to
        land go to the next run, whose steps wait for them (a startup lets a shutdown land
        first) instead of asking again."""
        task, self._task = self._task, None
        executor = self.executor
        if task is None or task.done() or executor is None:
            return None
        executor.stop(outcome)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # a run cancelled before its task began never ran its own ending: say it here
        self.ledger.finished(executor.spec.id, outcome, "stopped before its first step")
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
            self._refuse_once_swapped_out()
            return await self._trigger(direction, only, reason)

    async def _trigger(
        self, direction: Direction, only: Collection[ResourceId] | None, reason: str
    ) -> RunId:
        if self.busy and self.executor is not None:
            raise RunBusy(
                f"run {self.executor.run_id} is in progress: wait for it or 'upsguard abort' first"
            )
        if self._pair is not None and not self._pair.may_act():
            leader = self._pair.state().leader or "nobody (yet)"
            raise RunBusy(f"this controller is the standby of the pair: ask the leader, {leader}")
        chosen = set(only) if only else None
        if direction is Direction.STARTUP:
            self._refuse_startup_on_dying_feeds(chosen)
        kind = RunKind.SHUTDOWN if direction is Direction.SHUTDOWN else RunKind.STARTUP
        spec = self.ledger.new_spec(kind, RunOrigin.MANUAL, f"manual {kind}: {reason}", chosen)
        if chosen is not None:
            return await self._start(self.planner.plan(direction, chosen), spec)
        if direction is Direction.SHUTDOWN:
            self.engine.force(Phase.SHUTTING_DOWN, spec.reason)
            await self.caches.write_through()
            return await self._start(self.shutdown_plan, spec)
        if self.engine.phase is not Phase.RECOVERING:
            self.engine.force(Phase.RECOVERING, spec.reason)
        return await self._start(self.planner.plan(Direction.STARTUP), spec)

    def _refuse_startup_on_dying_feeds(self, chosen: set[ResourceId] | None) -> None:
        """A startup that powers up what a due shutdown must stop would make that shutdown
        the older run and leave the feed to run flat: never missing a shutdown outranks a
        person's startup, who is told which feeds and what to do."""
        if self.view is None:
            return
        due = set(self.engine.shutdown_due(self.view, self.plan_seconds()))
        if chosen is not None:
            powering = {f.name for r in chosen for f in self.site.feeds_powering(r)}
            due &= powering
        if due:
            names = ", ".join(sorted(due))
            raise RunBusy(
                f"feed {names} is on battery with its shutdown due: a startup now would "
                "power up what must stop; wait for the mains, or start only resources on "
                "other feeds (--only)"
            )

    async def abort(self) -> RunId | None:
        """Cancel the run in progress (it ends ``aborted``); returns its id (None when
        nothing ran)."""
        async with self._acting:
            self._refuse_once_swapped_out()
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

    @contextlib.asynccontextmanager
    async def between_acts(self) -> AsyncIterator[None]:
        """No run starts or stops meanwhile: a policy's decision or a person's command under
        way ends first. A reload swaps in the controller of a new site file here."""
        async with self._acting:
            yield

    def _refuse_once_swapped_out(self) -> None:
        if self._swapped_out:
            raise RunBusy("the site file was read again meanwhile: ask again")

    def take_over(self, before: OutageController) -> None:
        """Carry on from a controller of an older site file (``SIGHUP``): its phase, hold and
        timers, the caches it owes write-back, its requests not landed yet, the battery
        tests under way (their readings on battery are the test's, not an outage). The ledger
        is handed over at construction; readings and plans start afresh from the new file."""
        before._swapped_out = True
        self.engine = replace(
            before.engine, policies=self.site.policies, on_change=self._phase_changed
        )
        self.caches.owe(before.caches.owed)
        self._under_way.update(before._take_under_way())
        for name, watch in self.watches.items():
            if name in before.watches:
                watch.expect_self_test(before.watches[name].self_test_until)

    def asked_before(self, requests: Collection[UnderWay]) -> None:
        """Requests a controller before this one made that may still be landing (from the
        journal): the next run's steps wait for them rather than asking again."""
        self._under_way.update({request.key: request for request in requests})

    async def resume(
        self,
        spec: RunSpec,
        done: Mapping[StepId, StepState],
        told: Mapping[UpsName, datetime] | None = None,
    ) -> RunId:
        """Finish a run a dead or stopped controller left: the steps in ``done`` are not run
        again; every other step first reads its target's real state, and waits for a request
        of it under way (``asked_before`` the restart, or a task its platform lists) rather
        than asking again. The UPSes in ``told`` took the run's end command already (at the
        time given): they are not sent another."""
        self._end.told_before(spec.id, told or {})
        if spec.kind is RunKind.SHUTDOWN and spec.only is None:
            plan = self.shutdown_plan
        else:
            plan = self.planner.plan(spec.direction, set(spec.only) if spec.only else None)
        if plan.direction is Direction.STARTUP:
            done = _still_started(plan, done)
        return await self._start(plan, spec, already_done=done, resumed=True)

    def left_in_journal(self, run: SharedRun) -> None:
        """A pair's controller started with ``run`` in progress in its journal; the shared
        ledger is the pair's record, but a run begun while the store was silent never
        reached it (``lead``)."""
        self._journal_left = run

    def _unshared(self, records: list[RunRecord]) -> SharedRun | None:
        """The run this controller's journal left that the shared ledger never held: resumed
        when nothing newer went on since (its steps done are not repeated), else closed as
        superseded, so that the journal never keeps a run in progress that no one runs. One
        the shared ledger holds ended (the other controller finished it) ends so here too."""
        left, self._journal_left = self._journal_left, None
        if left is None:
            return None
        shared = next((r for r in records if r.spec.id == left.spec.id), None)
        if shared is not None:
            if shared.outcome is not None:
                why = f"ended in the shared ledger ({shared.outcome}): {shared.detail}"
                self._events(RunFinished(self._clock.now(), shared.spec, shared.outcome, why))
            return None
        self.ledger.restore([RunRecord(left.spec)])
        if all(r.spec.at < left.spec.at for r in records):
            return left
        why = "superseded: a newer run went on while its record was not in the shared ledger"
        self.ledger.finished(left.spec.id, RunOutcome.ABANDONED, why)
        return None

    async def lead(self, run: SharedRun | None, records: list[RunRecord]) -> RunId | None:
        """This controller won the lease: the runs are the shared ledger's from now on, and
        the run in progress there is resumed as a restarted controller resumes one (steps
        done are not repeated; the others re-check the real world and wait for the requests
        under way). Nothing is resumed while a run of this controller's own goes on (one it
        went on with alone, whose record the store never had: it is recorded now, for the
        other controller to follow). ``RunBusy`` when the site file was read again while
        this waited: the controller of the new file leads."""
        async with self._acting:
            self._refuse_once_swapped_out()
            if self._pair is not None:
                self.caches.owe(CacheName(c) for c in self._pair.owed)
            if self.busy:
                own = self.ledger.site().active
                if own is not None and self._pair is not None:
                    self._pair.changed(own)
                    self._pair.share_owed()
                return None
            self.ledger.follow(records)
            unshared = self._unshared(records)
            run = run if run is not None else unshared
            self._close_superseded(run.spec.id if run is not None else None)
            if run is None:
                return None
            if self._went_down_with_its_machine(run):
                self.ledger.finished(run.spec.id, RunOutcome.DONE, PAIR_POWEROFF)
                self._events(Notice(self._clock.now(), f"run {run.spec.id}: {PAIR_POWEROFF}"))
                return None
            if self._stale_on_mains(run.spec):
                why = (
                    "not resumed: every feed it concerns is on mains (its end was not "
                    "recorded in the store); the phase decides afresh"
                )
                self.ledger.finished(run.spec.id, RunOutcome.ABANDONED, why)
                self._events(Notice(self._clock.now(), f"run {run.spec.id}: {why}", "warning"))
                return None
            return await self._adopt(run)

    def _close_superseded(self, keep: RunId | None) -> None:
        """Runs the ledger still holds in progress beside ``keep`` (the run to resume or to
        start), or with none: their ends were not recorded (a write lost, a leader stopped
        before it wrote), and a newer run goes on. Closed, never resumed: left open, a startup
        whose end was lost read as running for good, and the phase never left recovering."""
        for record in self.ledger.newest_first():
            if record.active and record.spec.id != keep:
                why = "superseded: a newer run went on while its end was not recorded"
                self.ledger.finished(record.spec.id, RunOutcome.ABANDONED, why)

    def _stale_on_mains(self, spec: RunSpec) -> bool:
        """A policy's shutdown found in the store while every feed it concerns reads on
        mains, live: what it was for is over (a person's shutdown stands). A feed not read
        is no proof of mains: the run is resumed then."""
        view = self.view
        if spec.kind is not RunKind.SHUTDOWN or spec.origin is not RunOrigin.POLICY:
            return False
        if view is None:
            return False
        concerned = [f for f in view.feeds if spec.feeds is None or f.name in spec.feeds]
        return bool(concerned) and all(f.mains_seen for f in concerned)

    def _went_down_with_its_machine(self, run: SharedRun) -> bool:
        """A whole-site shutdown whose only steps left stop the controllers' machines, one
        of them marked started by the controller it stops, or every UPS of the run told its
        end command (the load cycle takes those machines down and brings them back): that
        controller powered itself off, last, and this start is the site coming back.
        Resuming would stop the machines again after every boot, and with no load cycle
        left to bring them back."""
        if run.spec.kind is not RunKind.SHUTDOWN or run.spec.only is not None:
            return False
        left = [s for s in self.plan_steps(run.spec) if s.id not in run.done]
        if not left or not all(self._controller_machine(s) for s in left):
            return False
        if self._end.all_told(run.spec, run.told):
            return True
        me = self._pair.me if self._pair is not None else ""
        for step in left:
            by = run.running_by.get(step.id)
            own = step.settings is not None and step.settings.resource.runs_upsguard
            if by is not None and (by == me) == own:
                return True
        return False

    async def _adopt(self, run: SharedRun) -> RunId:
        if self._pair is not None:
            resources = {s.resource for s in self.plan_steps(run.spec) if s.id in run.done}
            self._pair.gone(run.spec.id, resources)
        self.asked_before(run.requests)
        message = f"resuming {run.spec.kind} run {run.spec.id} from the shared ledger: " + (
            f"{len(run.done)} step(s) already done"
        )
        if run.unsure:
            message += f"; checking the real state of {', '.join(run.unsure)}"
        if run.told:
            message += f"; UPS {', '.join(sorted(run.told))} told already (not told again)"
        self._events(Notice(self._clock.now(), message, level="warning"))
        return await self.resume(run.spec, run.done, run.told)

    def plan_steps(self, spec: RunSpec) -> tuple[Step, ...]:
        """The steps of the plan ``resume`` would carry ``spec`` out with."""
        if spec.kind is RunKind.SHUTDOWN and spec.only is None:
            return self.shutdown_plan.steps
        return self.planner.plan(spec.direction, set(spec.only) if spec.only else None).steps

    def follow(self, records: list[RunRecord]) -> None:
        """The standby's runs are the shared ledger's (for the phase engine and status)."""
        if not self.busy:
            self.ledger.follow(records)

    def _phase_changed(
        self, old: Phase, new: Phase, reason: str, figures: Reckoning | None
    ) -> None:
        self._events(PhaseChanged(self._clock.now(), old, new, reason, figures))

    async def interrupt(self) -> None:
        """The service is stopping: the run in progress ends ``interrupted``, its running
        steps too, and nothing that waits on them starts; the next start resumes it. No run
        starts after: a poll under way would find the phase shutting down with no run
        carrying it and begin one, which the next start would resume in place of this one."""
        self._stopped = True
        await self._stop_run(RunOutcome.INTERRUPTED)

    async def step_down(self) -> None:
        """A pair's term ended: the run in progress ends ``interrupted`` (its steps' claims
        are refused anyway); the controller that leads now resumes it, and this one may
        lead again later."""
        await self._stop_run(RunOutcome.INTERRUPTED)


def _still_started(plan: Plan, done: Mapping[StepId, StepState]) -> dict[StepId, StepState]:
    """The startup steps a resume may trust as done: a power cycle since (the one that
    restarted this controller) may have undone any start, so each step that can read its
    target does so again (one found up is "already up"); a command's start cannot be read,
    and running it twice could do harm."""
    trusted = {
        s.id
        for s in plan.steps
        if s.settings is not None and s.settings.resource.kind is ResourceKind.COMMAND
    }
    return {step: state for step, state in done.items() if step in trusted}
