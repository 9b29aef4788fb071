"""``upsguard run``: the long-running service.

Start-up order matters: the journal opens first, the plugins are built
through the registry, then ``resume`` reaps what a crashed controller left and
finishes its run, and only then does APScheduler start polling (each tick
polls the UPSes, asks the phase engine and applies its decisions). SIGTERM
stops the scheduler and leaves a run in progress ``interrupted`` in the
journal, so the next start finishes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from upsguard.clock import Clock, SystemClock
from upsguard.config.site import SiteConfig
from upsguard.controller.journal import Journal
from upsguard.controller.metrics import Metrics
from upsguard.controller.notify import Notifier
from upsguard.controller.resume import reap_and_resume
from upsguard.engine.destage import DestageWatch
from upsguard.engine.outage_controller import OutageLoop
from upsguard.errors import UpsguardError
from upsguard.events import Event, EventBus, Notice, RiskAccepted, StepFinished, describe
from upsguard.models import PlatformName, StepState
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.registry import build_cache_providers, build_platforms, build_ups_sources

log = logging.getLogger(__name__)
event_log = logging.getLogger("upsguard.events")


class Service:
    """Everything a running controller holds; ``open`` builds it, ``close`` lets it go."""

    def __init__(self, site: SiteConfig, clock: Clock | None = None) -> None:
        self.site = site
        self.clock: Clock = clock or SystemClock()
        self.bus = EventBus()
        self.journal = Journal(site.journal, site.service.readings_every)
        self.bus.subscribe(self.journal.record)
        self.bus.subscribe(_log_event)
        self.bus.subscribe(self._wake)
        self.metrics = Metrics()
        self.bus.subscribe(self.metrics.observe)
        self.notifier = Notifier(site.service.notify, site.site)
        self.bus.subscribe(self.notifier.observe)
        self.loop: OutageLoop | None = None
        self.platforms: dict[PlatformName, Platform] = {}
        self._opened: set[PlatformName] = set()
        self.started = datetime.now(UTC)
        self.resumed: str | None = None
        self.changed = asyncio.Event()
        self.ticks = 0
        self.last_tick_error: str | None = None
        self._poll_lock = asyncio.Lock()

    def _wake(self, event: Event) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    @property
    def outage(self) -> OutageLoop:
        if self.loop is None:
            raise RuntimeError("Service.open() first")
        return self.loop

    async def open(self, resume: bool = True) -> None:
        """Build the plugins and the outage loop, then finish what a crash left."""
        sources = build_ups_sources(self.site, self.clock)
        self.platforms = build_platforms(self.site, self.clock)
        await self.open_platforms()
        providers = build_cache_providers(self.site, self.clock)
        caches = DestageWatch(self.site, providers, self.clock, self.bus)
        self.loop = OutageLoop(
            self.site,
            sources=sources,
            platforms=self.platforms,
            caches=caches,
            clock=self.clock,
            events=self.bus,
            journal=self.journal,
        )
        self.metrics.attach(self.loop)
        if resume:
            self.resumed = await reap_and_resume(self.journal, self.loop, self.clock, self.bus)

    async def open_platforms(self) -> None:
        """Connect every platform not yet connected; one that fails is retried later."""
        pending = [n for n in self.platforms if n not in self._opened]
        for name in pending:
            try:
                await self.platforms[name].open()
            except UpsguardError as exc:
                message = f"platform {name}: {exc} (retried every minute)"
                self.bus(Notice(self.clock.now(), message, level="warning"))
            else:
                self._opened.add(name)

    async def tick(self) -> None:
        """One poll; an unexpected error is logged and the next poll tries again."""
        try:
            await self.outage.tick()
            self.last_tick_error = None
        except Exception as exc:  # the service must keep watching the power
            if str(exc) != self.last_tick_error:
                log.exception("poll failed")
                self.bus(Notice(self.clock.now(), f"poll failed: {exc}", level="error"))
            self.last_tick_error = str(exc)
        self.ticks += 1

    async def poll_now(self) -> None:
        """An extra poll between the scheduled ones; never two polls at once."""
        async with self._poll_lock:
            await self.tick()

    async def refresh_caches(self) -> None:
        """Keep the caches' mode and dirty bytes current for status and metrics (a destage
        wait polls on its own, faster)."""
        try:
            await self.outage.caches.poll()
        except Exception as exc:  # a cache that cannot be read is shown as such, not fatal
            log.warning("reading caches: %s", exc)

    async def housekeeping(self) -> None:
        """Async on purpose: the journal's connection belongs to the event loop's thread."""
        pruned = self.journal.prune_readings(self.clock.now(), self.site.service.keep_readings)
        if pruned:
            log.info("journal: pruned %d old readings", pruned)

    def scheduler(self) -> AsyncIOScheduler:
        """Polling and timers; a poll never overlaps the one before it."""
        sched = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
        poll = self.site.policies.poll_interval.total_seconds()
        now = datetime.now(UTC)
        sched.add_job(
            self.poll_now,
            "interval",
            seconds=poll,
            next_run_time=now,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            id="poll",
        )
        sched.add_job(self.open_platforms, "interval", minutes=1, id="platforms", coalesce=True)
        if self.site.caches:
            sched.add_job(
                self.refresh_caches, "interval", seconds=30, next_run_time=now, coalesce=True
            )
        sched.add_job(
            self.housekeeping, "interval", hours=6, next_run_time=now + timedelta(minutes=1)
        )
        return sched

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set: API socket, metrics, scheduler."""
        from upsguard.controller.api import ApiServer

        api = ApiServer(self, self.site.service.socket, self.site.service.socket_group)
        await api.start()
        if self.site.service.metrics_port is not None:
            self.metrics.serve(self.site.service.metrics_address, self.site.service.metrics_port)
        sched = self.scheduler()
        sched.start()
        _sd_notify("READY=1")
        self.bus(Notice(self.clock.now(), f"upsguard serving site {self.site.site}"))
        try:
            await stop.wait()
        finally:
            _sd_notify("STOPPING=1")
            sched.shutdown(wait=False)
            await api.stop()
            self.metrics.stop()

    async def close(self) -> None:
        """Let go of everything; a run in progress stays unfinished in the journal."""
        self.journal.stopping = True
        if self.loop is not None:
            await self.loop.close()
            for source in self.loop.sources.values():
                await _quietly(source.close())
        for platform in self.platforms.values():
            await _quietly(platform.close())
        await self.notifier.drain()
        self.journal.close()


async def run_service(site: SiteConfig, stop: asyncio.Event) -> None:
    service = Service(site)
    try:
        await service.open()
        await service.serve(stop)
    finally:
        await service.close()


def _log_event(event: Event) -> None:
    text = describe(event)
    if text is None:
        return
    failed = isinstance(event, StepFinished) and event.state is StepState.FAILED
    if isinstance(event, RiskAccepted) or failed:
        event_log.error(text.strip())
    elif isinstance(event, Notice) and event.level in ("warning", "error"):
        event_log.log(logging.getLevelName(event.level.upper()), text)
    else:
        event_log.info(text.strip())


async def _quietly(awaitable: object) -> None:
    try:
        await awaitable  # type: ignore[misc]
    except Exception as exc:  # closing must never stop the others from closing
        log.warning("closing: %s", exc)


def _sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) where we are; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.debug("sd_notify: %s", exc)
