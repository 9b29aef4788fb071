"""Everything one site file builds, built in one place and torn down in reverse.

A site file makes the plugins (UPS sources, platforms, cache providers), the destage watch,
the outage controller, the overrides and the schedule. ``SiteRuntime.build`` makes them and
registers each one's teardown on one ``AsyncExitStack`` as it goes, so a build that fails
half-way lets go of what it had made, and ``close`` lets go of all of it in reverse: the run
in progress interrupted first, then the platforms and the UPS connections.

A reload of the site file (``SIGHUP``) is: build a new runtime, have it ``take_over`` the old
one's run (phase, hold, timers, the caches owed write-back, the requests under way, a battery
test under way), swap it in, close the old one, then ``start`` the new one's calendar jobs and
change listeners. Nothing of an old runtime is kept by anyone after its close: whatever acts
later (the calendar's jobs, a person's override, the web page) asks the service for the one
in force.

What outlives a site file (the journal, the event bus, the run ledger, the pair, the API,
metrics and the web page) belongs to the service and is lent to each build (``Lent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.controller.overrides import Overrides
from upsguard.controller.schedule import Schedule
from upsguard.engine.destage import DestageWatch
from upsguard.engine.inventory import read_inventory
from upsguard.engine.ledger import RunLedger
from upsguard.engine.outage_controller import OutageController
from upsguard.engine.pair import Pair
from upsguard.errors import UpsguardError
from upsguard.events import EventSink, Notice
from upsguard.journal import Journal
from upsguard.journal.as_before import found_off
from upsguard.journal.learned import learned_durations
from upsguard.models import Phase, PlatformName
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.registry import SitePlugins
from upsguard.plugins.ups.base import UpsSource
from upsguard.runbooks.planner import Planner

log = logging.getLogger(__name__)

INVENTORY_WITHIN_S = 10.0
"""How long the platforms may take to list their VMs before plans are made without: a
controller starting in an outage must not stay blind behind a vCenter that hangs (the plans
are made again from fresh inventory every ``REPLAN_EVERY_S``, and before each run)."""

PluginBuilder = Callable[[SiteConfig, Clock], SitePlugins]


@dataclass(frozen=True)
class Lent:
    """What the service lends every runtime it builds: it outlives each site file."""

    clock: Clock
    events: EventSink
    journal: Journal
    plugins: PluginBuilder
    ledger: RunLedger
    pair: Pair | None
    current: Callable[[], OutageController]
    """The controller in force when asked: what a battery test started before a reload
    follows after it."""


class SiteRuntime:
    """The plugins, controller, overrides and schedule of one site file; ``build`` makes
    them, ``close`` lets them go."""

    def __init__(self, site: SiteConfig, lent: Lent, stack: contextlib.AsyncExitStack) -> None:
        """Use ``build``: a runtime made here holds nothing yet."""
        self.site = site
        self._lent = lent
        self._stack = stack
        self.platforms: dict[PlatformName, Platform] = {}
        self._opened: set[PlatformName] = set()
        self._inventory_problem: str | None = None
        self._controller: OutageController | None = None
        self._overrides: Overrides | None = None
        self._schedule: Schedule | None = None
        self.listening = False
        """Its UPSes' change channels are heard (``listen``): a runtime that takes over
        from one that listened listens too."""

    @classmethod
    async def build(cls, site: SiteConfig, lent: Lent) -> SiteRuntime:
        """Make everything ``site`` says, each teardown registered as it is made; a build
        that fails lets go of what it had made and raises."""
        async with contextlib.AsyncExitStack() as stack:
            runtime = cls(site, lent, stack)
            await runtime._make()
            built = stack.pop_all()
        runtime._stack = built
        return runtime

    async def _make(self) -> None:
        lent = self._lent
        plugins = lent.plugins(self.site, lent.clock)
        for source in plugins.sources.values():
            self._stack.push_async_callback(_close, source)
        for cache in plugins.caches.values():
            self._stack.push_async_callback(_close, cache)
        self.platforms = plugins.platforms
        for platform in self.platforms.values():
            self._stack.push_async_callback(_close, platform)
        await self.open_platforms()
        caches = DestageWatch(self.site, plugins.caches, lent.clock, lent.events)
        controller = OutageController(
            self.site,
            sources=plugins.sources,
            platforms=self.platforms,
            caches=caches,
            clock=lent.clock,
            events=lent.events,
            planner=await self.planner(),
            ledger=lent.ledger,
            replan=self.planner,
            pair=lent.pair,
            found_off=None if lent.pair is not None else partial(found_off, lent.journal),
        )
        self._stack.push_async_callback(controller.interrupt)  # first: no step starts after
        self._controller = controller
        self._overrides = Overrides(self.site, controller, lent.events, lent.clock)
        self._schedule = Schedule(self.site, lent.clock, lent.events, lent.journal, lent.current)

    @property
    def controller(self) -> OutageController:
        assert self._controller is not None, "SiteRuntime.build makes it"
        return self._controller

    @property
    def overrides(self) -> Overrides:
        assert self._overrides is not None, "SiteRuntime.build makes it"
        return self._overrides

    @property
    def schedule(self) -> Schedule:
        assert self._schedule is not None, "SiteRuntime.build makes it"
        return self._schedule

    @property
    def phase(self) -> Phase:
        """The phase the site is in (what the API's cheapest question asks)."""
        return self.controller.phase

    @property
    def held(self) -> str | None:
        """The reason of a person's hold, while one defers the automatic actions."""
        return self.controller.held

    def take_over(self, old: SiteRuntime) -> None:
        """Carry on the run of ``old`` (a runtime of an older site file): its phase, hold
        and timers, the caches it owes write-back, its requests not landed yet, and a
        battery test under way. The ledger is the service's, the same for both."""
        self.controller.take_over(old.controller)
        self._inventory_problem = old._inventory_problem
        self.listening = old.listening

    def start(self, calendar: AsyncIOScheduler | None, request_poll: Callable[[], None]) -> None:
        """Once in force in place of another: its calendar jobs (when the service keeps a
        calendar) and its UPSes' change channels (when the one before listened)."""
        if calendar is not None:
            self.add_jobs(calendar)
        if self.listening:
            self.listen(request_poll)

    def add_jobs(self, calendar: AsyncIOScheduler) -> None:
        """Its scheduled checks and battery tests on the service's calendar, removed at
        ``close``."""
        ids = self.schedule.add_jobs(calendar)
        self._stack.callback(_remove_jobs, calendar, ids)

    def listen(self, request_poll: Callable[[], None]) -> None:
        """One task per UPS listening for its changes (an SNMP trap): a poll at once."""
        self.listening = True
        tasks = [
            asyncio.create_task(
                self._watch_changes(source, request_poll), name=f"changes of {name}"
            )
            for name, source in self.controller.sources.items()
        ]
        self._stack.push_async_callback(_cancel, tasks)

    async def _watch_changes(self, source: UpsSource, request_poll: Callable[[], None]) -> None:
        """A UPS's own channel for its changes; losing it only means waiting for the next poll."""
        try:
            await source.watch_for_changes(request_poll)
        except Exception as exc:  # one UPS's channel never stops the others or the polls
            message = f"UPS {source.name}: not listening for its changes: {exc} (polled as usual)"
            self._lent.events(Notice(self._lent.clock.now(), message, level="warning"))

    async def close(self) -> None:
        """Let go of everything it built, in reverse: a run in progress is interrupted
        (it stays unfinished in the journal), then the platforms and the UPS connections."""
        await self._stack.aclose()

    async def open_platforms(self) -> None:
        """Connect every platform not yet connected; one that fails is retried later, and
        never keeps the others from opening."""
        pending = [n for n in self.platforms if n not in self._opened]
        for name in pending:
            try:
                await self.platforms[name].open()
            except Exception as exc:  # one broken platform never blinds the controller
                if not isinstance(exc, UpsguardError):
                    log.exception("platform %s failed to open", name)
                message = f"platform {name}: {exc} (retried every minute)"
                self._lent.events(Notice(self._lent.clock.now(), message, level="warning"))
            else:
                self._opened.add(name)

    async def planner(self) -> Planner:
        """Plans from live inventory (where each VM runs decides which hosts wait on which
        cache) and learned durations; without inventory, from the site file alone, and the
        risk is said. A plan live inventory cannot make (a host found running a VM it needs:
        a cycle) is said the same way: the site file's own plan has none."""
        durations = learned_durations(self._lent.journal)
        try:
            async with asyncio.timeout(INVENTORY_WITHIN_S):
                found = await read_inventory(self.site, self.platforms)
            live = Planner(self.site, found.targets, found.unplanned, durations=durations)
        except Exception as exc:  # a platform down, or a plugin's bug: plan without it
            if not isinstance(exc, UpsguardError | TimeoutError):
                log.exception("reading live inventory failed")
            why = str(exc) or f"no answer within {INVENTORY_WITHIN_S:g}s"
            if why != self._inventory_problem:
                self._inventory_problem = why
                message = (
                    f"planning without live inventory ({why}): VMs are placed as the site "
                    "file says, so a cache may not gate the host a VM really runs on"
                )
                self._lent.events(Notice(self._lent.clock.now(), message, level="warning"))
            return Planner(self.site, durations=durations)
        self._inventory_problem = None
        return live

    async def refresh_plans(self) -> None:
        """Plans made again from fresh inventory: VMs move (vMotion, DRS)."""
        self.controller.use_planner(await self.planner())

    async def refresh_caches(self) -> None:
        """Keep the caches' mode and dirty bytes current for status and metrics (a destage
        wait polls on its own, faster)."""
        try:
            await self.controller.caches.poll()
        except Exception as exc:  # a cache that cannot be read is shown as such, not fatal
            log.warning("reading caches: %s", exc)


class Closable(Protocol):
    """Anything a runtime builds that holds a connection."""

    async def close(self) -> None: ...


async def _close(plugin: Closable) -> None:
    try:
        await plugin.close()
    except Exception as exc:  # closing must never stop the others from closing
        log.warning("closing: %s", exc)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _remove_jobs(calendar: AsyncIOScheduler, ids: list[str]) -> None:
    for job in ids:
        with contextlib.suppress(LookupError):  # JobLookupError: gone already
            calendar.remove_job(job)
