"""The outage loop: poll the UPSes, ask the phase engine, carry out its decisions.

The service (``upsguard run``) calls ``tick`` from its scheduler; the
simulator calls it on a virtual clock. Both get the same policy decisions,
the same executor and the same cache handling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.events import EventSink, Notice, PhaseChanged, ReadingTaken
from upsguard.models import CacheMode, Phase, PlatformName, ResourceId, Target, UpsName
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.ups.base import UpsSource
from upsguard.policies.phases import Act, Decision, PhaseEngine, PowerView, RunState
from upsguard.policies.power import UpsFigures, read_feeds
from upsguard.policies.watch import UpsWatch
from upsguard.runbooks.destage import DestageGate, DestageWatch
from upsguard.runbooks.executor import Executor, RunResult
from upsguard.runbooks.plan import Direction, Plan
from upsguard.runbooks.planner import build_plan

log = logging.getLogger(__name__)


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
    ) -> None:
        self.site = site
        self.watches = {name: UpsWatch(src, clock) for name, src in sources.items()}
        self.sources = dict(sources)
        self.platforms = platforms
        self.caches = caches
        self._clock = clock
        self._events = events
        self._inventory = inventory
        self.engine = PhaseEngine(site.policies, on_change=self._phase_changed)
        self.shutdown_plan = build_plan(site, Direction.SHUTDOWN, inventory)
        self.runs = RunState()
        self.executor: Executor | None = None
        self._task: asyncio.Task[RunResult] | None = None
        self.view: PowerView | None = None
        self.results: list[RunResult] = []
        self._sequence = 0

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
        figures = {
            name: UpsFigures(w.last, w.runtime_s(), w.depletion_pct_per_min)
            for name, w in self.watches.items()
            if w.last is not None
        }
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

    async def _start(self, plan: Plan, reason: str) -> None:
        await self._cancel()
        self._sequence += 1
        run_id = f"{plan.direction.value}-{self._clock.now():%Y%m%dT%H%M%SZ}-{self._sequence}"
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
        )
        if plan.direction is Direction.SHUTDOWN:
            self.runs.something_stopped = True
            self.runs.shutdown_running = plan is self.shutdown_plan
            self.runs.shutdown_finished = False
        else:
            self.runs.startup_running = True
        self._task = asyncio.create_task(self.executor.run(), name=run_id)
        self._task.add_done_callback(self._run_done)

    def _run_done(self, task: asyncio.Task[RunResult]) -> None:
        if task.cancelled() or self.executor is None:
            return
        result = task.result()
        self.results.append(result)
        if result.direction is Direction.STARTUP:
            self.runs.startup_running = False
            self.runs.startup_finished = True
            self.runs.something_stopped = False
            self.runs.cancelled_before_ponr = False
        elif self.executor.plan is self.shutdown_plan:
            self.runs.shutdown_running = False
            self.runs.shutdown_finished = True
            asyncio.get_running_loop().create_task(self._ups_commands())

    async def _cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            result = await asyncio.gather(task, return_exceptions=True)
            if self.executor is not None and isinstance(result[0], RunResult):
                self.results.append(result[0])
        self.runs.shutdown_running = False

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

    def _phase_changed(self, old: Phase, new: Phase, reason: str) -> None:
        self._events(PhaseChanged(self._clock.now(), old, new, reason))

    async def close(self) -> None:
        await self._cancel()
