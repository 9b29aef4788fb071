"""``upsguard run``: the long-running service.

Start-up order matters: the journal opens first, the plugins are built through the
registry, then ``resume`` reaps what a crashed controller left and finishes its run, and
only then does the power watch start polling (each tick polls the UPSes, asks the phase
engine and applies its decisions). The power watch and every periodic task run on the
event loop's monotonic clock, so a step of the wall clock never pauses them; APScheduler
keeps only the calendar jobs (journal pruning). SIGTERM stops the watch and leaves a run
in progress ``interrupted``, so the next start finishes it.

With ``ha:`` in the site file the service is one controller of an active/standby pair
(docs/ha.md): it builds the coordination store through the registry and its
``Leadership``, runs the campaign or renewals, the shared ledger's writer and the standby's
following beside the power watch, and resumes the shared ledger's run when it wins the
lease, never the one its own journal left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from upsguard.clock import Clock, SystemClock
from upsguard.config.checks import site_warnings
from upsguard.config.loading import load_site
from upsguard.config.site import SiteConfig
from upsguard.controller.lock import JournalLock
from upsguard.controller.metrics import Metrics
from upsguard.controller.notify import Notifier
from upsguard.controller.overrides import Overrides
from upsguard.controller.runtime import Lent, PluginBuilder, SiteRuntime
from upsguard.controller.schedule import Schedule
from upsguard.controller.socket_group import group_id
from upsguard.controller.status import ServiceInfo, pair_status, service_status, ups_seen
from upsguard.controller.supervision import Supervisor
from upsguard.controller.systemd import Watchdog, notify
from upsguard.engine.leadership import Leadership, LeadershipState, Role
from upsguard.engine.ledger import RunLedger
from upsguard.engine.outage_controller import OutageController
from upsguard.engine.pair import Pair
from upsguard.errors import PermanentError, RunBusy, UpsguardError
from upsguard.events import Event, EventBus, LeadershipChanged, Notice, describe, level
from upsguard.journal import Journal
from upsguard.journal.resume import reap_and_resume
from upsguard.journal.stream import EventStream
from upsguard.models import Phase, PlatformName
from upsguard.plugins import catalog
from upsguard.plugins.coordination.base import Candidate, CoordinationStore, SharedLedger
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.registry import build_plugins, build_store
from upsguard.status import SiteStatus

if TYPE_CHECKING:
    from upsguard.controller.web.server import WebServer

log = logging.getLogger(__name__)

REPLAN_EVERY_S = 300.0
"""VMs move (vMotion, DRS): plans are made again from fresh inventory this often."""
event_log = logging.getLogger("upsguard.events")

StoreBuilder = Callable[[SiteConfig], CoordinationStore | None]


class Service:
    """Everything a running controller holds; ``open`` builds it, ``close`` lets it go."""

    def __init__(
        self,
        site: SiteConfig,
        clock: Clock | None = None,
        plugins: PluginBuilder = build_plugins,
        log_events: bool = True,
        site_path: Path | None = None,
        store: StoreBuilder = build_store,
    ) -> None:
        """``plugins`` builds what the service acts through: the registry's classes, or the
        tests' simulated world. ``log_events``: False when the caller prints every event
        itself (``trigger`` without a service), or each would be said twice.
        ``site_path``: the site file, read again on ``SIGHUP`` (``request_reload``).
        ``store``: builds the coordination store of a pair (``ha:``); the tests' in-memory
        one, or the registry's."""
        self.site = site
        self.clock: Clock = clock or SystemClock()
        self._build_plugins = plugins
        self._build_store = store
        self.pair: Pair | None = None
        self._term: int | None = None
        self._pair_tasks: set[asyncio.Task[None]] = set()
        self._taking_over: set[asyncio.Task[None]] = set()
        self.bus = EventBus()
        self.lock = JournalLock(site.journal)
        self.lock.acquire()
        self.stream = EventStream()
        self.journal = Journal(
            site.journal,
            site.service.readings_every,
            repair=True,
            on_problem=self._journal_problem,
            group_id=_socket_group_id(site.service.socket_group),
            on_line=self.stream.added,
        )
        self.bus.subscribe(self.journal.write.record)
        if log_events:
            self.bus.subscribe(_log_event)
        self.metrics = Metrics()
        self.bus.subscribe(self.metrics.observe)
        self.notifier = Notifier(
            site.service.notify, site.site, clock=self.clock, policies=site.policies
        )
        self.bus.subscribe(self.notifier.observe)
        self.changed = asyncio.Event()
        """Set at the next event of any kind, then replaced: what the web page's live status
        waits on (a reading changes the status, though it is no journal line)."""
        self.bus.subscribe(self._wake)
        self._runtime: SiteRuntime | None = None
        self._lent: Lent | None = None
        """What each build of the site file is lent (``open`` makes it: the ledger's sink
        is the pair)."""
        self._calendar: AsyncIOScheduler | None = None
        self._supervisor: Supervisor | None = None
        self._page: WebServer | None = None
        """The web page, once started: a reload hands it the new file's users."""
        self.started = datetime.now(UTC)
        self.resumed: str | None = None
        self.ticks = 0
        self.last_tick_error: str | None = None
        self._poll_lock = asyncio.Lock()
        self._poll_wanted = asyncio.Event()
        self.site_path = site_path
        self._hangup = asyncio.Event()
        self._waiting_site: SiteConfig | None = None
        self.watchdog = Watchdog.from_environment()
        """systemd's watchdog (``WatchdogSec=``), petted by the power watch; None without."""

    def _wake(self, event: Event) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _journal_problem(self, problem: str | None) -> None:
        """The journal's trouble is an alert, notified like any other; never a stop."""
        if problem is None:
            self.bus(Notice(self.clock.now(), f"journal {self.journal.path} is written again"))
        else:
            self.bus(Notice(self.clock.now(), problem, level="error"))

    @property
    def runtime(self) -> SiteRuntime:
        """What the site file in force built (``controller.runtime``)."""
        if self._runtime is None:
            raise RuntimeError("Service.open() first")
        return self._runtime

    @property
    def failed(self) -> str | None:
        """Why the service stopped on its own (a long-running task failed), else None."""
        return self._supervisor.failed if self._supervisor is not None else None

    @property
    def controller(self) -> OutageController:
        return self.runtime.controller

    @property
    def overrides(self) -> Overrides:
        return self.runtime.overrides

    @property
    def phase(self) -> Phase:
        """The phase the site is in."""
        return self.runtime.phase

    @property
    def schedule(self) -> Schedule:
        """The scheduled checks and battery tests of the site file in force."""
        return self.runtime.schedule

    @property
    def platforms(self) -> dict[PlatformName, Platform]:
        return self.runtime.platforms

    def status(self) -> SiteStatus:
        """What ``upsguard status`` shows of the running service."""
        info = ServiceInfo(
            pid=os.getpid(),
            since=self.started,
            polls=self.ticks,
            resumed=self.resumed,
            poll_interval_s=self.site.policies.poll_interval.total_seconds(),
        )
        alerts = [problem for problem in (self.journal.problem,) if problem]
        pair = pair_status(self.pair, self.clock.monotonic()) if self.pair is not None else None
        return service_status(
            self.site, self.controller, self.journal, info, alerts, self.clock.now(), pair
        )

    async def open(self, resume: bool = True) -> None:
        """Build what the site file says (``SiteRuntime``), then finish what a crash left."""
        self.pair = self._open_pair()
        self._lent = Lent(
            clock=self.clock,
            events=self.bus,
            journal=self.journal,
            plugins=self._build_plugins,
            ledger=RunLedger(self.clock, self.bus, sink=self.pair),
            pair=self.pair,
            current=lambda: self.controller,
        )
        self._runtime = await SiteRuntime.build(self.site, self._lent)
        self.metrics.attach(self.controller)
        if resume:
            self.resumed = await reap_and_resume(
                self.journal, self.controller, self.clock, self.bus, resume=self.pair is None
            )

    def _open_pair(self) -> Pair | None:
        """This controller's side of the pair, when the site file has ``ha:``."""
        ha = self.site.ha
        store = self._build_store(self.site)
        if ha is None or store is None:
            return None
        own = next((r.id for r in self.site.resources if r.runs_upsguard), None)
        leadership = Leadership(
            store,
            Candidate(ha.name, own),
            ttl_s=ha.lease_ttl.total_seconds(),
            fence_margin_s=ha.fence_margin.total_seconds(),
            clock=self.clock,
            on_change=self._leadership_changed,
        )
        pair = Pair(
            leadership,
            store,
            self.clock,
            members=len(ha.endpoints),
            store_machines=ha.store_machines,
            views_store=self._build_store(self.site),
        )
        self.bus.subscribe(pair.observe)
        return pair

    def _leadership_changed(self, state: LeadershipState) -> None:
        """Journaled and notified; a new term resumes the shared ledger's run; a lost one
        interrupts the run in progress (its steps' claims are refused anyway)."""
        self.bus(
            LeadershipChanged(
                self.clock.now(),
                state.me,
                state.role.value,
                state.leader,
                state.token,
                state.detail,
            )
        )
        if state.role is Role.LEADER and state.token != self._term:
            self._term = state.token
            self._spawn(self._take_over(), "take over", taking_over=True)
        elif state.role is Role.STANDBY:
            self._term = None
            if self._runtime is not None and self.controller.busy:
                self._spawn(self.controller.step_down(), "interrupt the run")

    def _spawn(self, job: Awaitable[None], name: str, *, taking_over: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(_quietly(job), name=name)
        self._pair_tasks.add(task)
        task.add_done_callback(self._pair_tasks.discard)
        if taking_over:
            self._taking_over.add(task)
            task.add_done_callback(self._taking_over.discard)

    @property
    def taking_over(self) -> bool:
        """Won the lease, the shared ledger's run not taken up yet: until then the runs it
        holds are the store's, as a standby's are."""
        return bool(self._taking_over)

    async def _take_over(self) -> None:
        """Won the lease: resume the run the shared ledger holds (unless the other
        controller said it finishes alone)."""
        pair = self.pair
        if pair is None:
            return
        ledger = await pair.latest()
        if ledger is None:
            return
        if (
            ledger.alone is not None
            and ledger.alone.by != pair.me
            and ledger.alone.holds(ledger.leader)
        ):
            message = (
                f"{ledger.alone.by} finishes alone since {ledger.alone.at:%H:%M:%S} "
                f"({ledger.alone.reason}): {pair.me} does not take over"
            )
            self.bus(Notice(self.clock.now(), message, level="warning"))
            return
        while True:
            try:
                resumed = await self.controller.lead(pair.shared_run(ledger), list(ledger.runs))
                break
            except RunBusy:  # the site file was read again meanwhile: its controller leads
                continue
        if resumed is not None:
            self.resumed = resumed

    def _follow(self, ledger: SharedLedger) -> None:
        if self._runtime is not None:
            self.controller.follow(list(ledger.runs))

    async def open_platforms(self) -> None:
        """Connect every platform not yet connected; one that fails is retried later."""
        await self.runtime.open_platforms()

    async def tick(self) -> None:
        """One poll; an unexpected error is logged and the next poll tries again."""
        try:
            await self.controller.tick()
            if self._waiting_site is not None:
                await self._take_in_force(self._waiting_site)
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

    def request_poll(self) -> None:
        """A UPS announced a change (an SNMP trap): poll at once. Requests before that poll
        starts share it; one during it brings one more poll after it."""
        self._poll_wanted.set()

    # -- SIGHUP: the site file again ----------------------------------------------------

    def request_reload(self) -> None:
        """``SIGHUP``: read the site file again (at once; applied as ``reload`` says)."""
        self._hangup.set()

    @staticmethod
    async def _each_time(wanted: asyncio.Event, act: Callable[[], Awaitable[None]]) -> None:
        """Requests that come before the act starts share it; one during it brings one more."""
        while True:
            await wanted.wait()
            wanted.clear()
            await act()

    async def reload(self) -> None:
        """Read the site file again. A file with a mistake changes nothing: the one in force
        stays, and the mistake is an alert. A good one is journaled and takes effect at once,
        or, while a run is in progress, once it has ended (a run keeps the plan it started
        with). The web page's users and roles take effect at once, run or not; the journal,
        the socket, metrics and the rest of the web page keep their settings until the next
        start."""
        if self.site_path is None:
            return
        now = self.clock.now
        try:
            site = load_site(self.site_path, catalog.names)
        except UpsguardError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            message = f"site file {self.site_path} not reloaded, the one in force stays: {first}"
            self.bus(Notice(now(), message, level="error"))
            return
        if self._page is not None:
            self._page.apply(site.web)
        async with self._poll_lock:  # between polls (a tick takes a waiting file in force)
            if await self._take_in_force(site):
                return
            self._waiting_site = site
            run = self.controller.executor.run_id if self.controller.executor else "?"
            message = f"site file {self.site_path} read again: it takes effect once run {run} ends"
            self.bus(Notice(now(), message))

    async def _take_in_force(self, site: SiteConfig) -> bool:
        """Swap in the controller of ``site``, unless a run is in progress. Between polls (the
        caller holds the poll lock) and between acts: a controller swapped in the middle of a
        poll's decisions or a person's command would go on alone with them (a phase, a run, a
        cache flip the new one never hears of)."""
        async with self.controller.between_acts():
            if self.controller.busy:
                return False
            await self._swap(site)
            return True

    async def _swap(self, site: SiteConfig) -> None:
        """Take ``site`` in force: build it anew, hand the run on (the same runs, phase and
        hold), swap, and close the old build; then the new one's jobs and listeners start.
        A build that fails leaves the one in force as it was."""
        self._waiting_site = None
        old = self.runtime
        assert self._lent is not None, "open made the runtime in force"
        try:
            new = await SiteRuntime.build(site, self._lent)
        except UpsguardError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            message = f"site file {self.site_path} not reloaded, the one in force stays: {first}"
            self.bus(Notice(self.clock.now(), message, level="error"))
            return
        new.take_over(old)
        self._runtime = new
        self.site = site
        self.notifier.use(site.service.notify, site.policies)
        self.metrics.attach(new.controller)
        await old.close()
        new.start(self._calendar, self.request_poll)
        message = f"site file {self.site_path} reloaded: {len(site.resources)} resources"
        self.bus(Notice(self.clock.now(), message, level="warning"))

    async def refresh_caches(self) -> None:
        """Keep the caches' mode and dirty bytes current for status and metrics."""
        await self.runtime.refresh_caches()

    async def _refresh_plans(self) -> None:
        await self.runtime.refresh_plans()

    async def _retry_journal(self) -> None:
        self.journal.retry()

    async def housekeeping(self) -> None:
        """Async on purpose: the journal's connection belongs to the event loop's thread."""
        pruned = self.journal.write.prune_readings(
            self.clock.now(), self.site.service.keep_readings
        )
        if pruned:
            log.info("journal: pruned %d old readings", pruned)

    async def watch_power(self, stop: asyncio.Event) -> None:
        """Poll every ``poll_interval`` on the monotonic clock until ``stop``; a poll never
        overlaps the one before it, and a slow poll is followed at once by the next. Under
        systemd's watchdog each pass pets it, after the poll and while waiting for the next:
        a watch wedged in a poll stops petting, and systemd restarts the service (a run
        under way goes on meanwhile: its steps do not hold up the poll)."""
        period = self.site.policies.poll_interval.total_seconds()
        await _every(period, self.poll_now, stop, alive=self.watchdog)

    def calendar(self) -> AsyncIOScheduler:
        """Jobs that belong to the calendar, not to the power watch: journal pruning, and
        the site file's scheduled checks and battery tests (``controller.schedule``; a
        reload replaces them with the new file's)."""
        sched = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
        sched.add_job(
            self.housekeeping,
            "interval",
            hours=6,
            next_run_time=datetime.now(UTC) + timedelta(minutes=1),
            id="housekeeping",
        )
        self._calendar = sched
        self.runtime.add_jobs(sched)
        return sched

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set: API socket, metrics, the power watch, periodic tasks."""
        from upsguard.controller.api import ApiServer

        api = ApiServer(self, self.site.service.socket, self.site.service.socket_group)
        await api.start()
        if self.site.service.metrics_port is not None:
            self.metrics.serve(self.site.service.metrics_address, self.site.service.metrics_port)
        page = await self._start_web()
        sched = self.calendar()
        sched.start()
        tasks = self.watch(stop)
        notify("READY=1")
        self.bus(Notice(self.clock.now(), f"upsguard serving site {self.site.site}"))
        for loc, message in site_warnings(self.site):  # what validate warned of, at every start
            self.bus(Notice(self.clock.now(), self.site.problem(loc, message), level="warning"))
        try:
            await stop.wait()
        finally:
            notify("STOPPING=1")
            await self.controller.interrupt()  # first: no step starts once told to stop
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sched.shutdown(wait=False)
            await api.stop()
            if page is not None:
                self._page = None
                await page.stop()
            self.metrics.stop()

    def watch(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        """The service's own tasks on the monotonic clock, until ``stop``: the power watch,
        platforms that failed to open, the journal's retry, fresh plans, the UPSes' changes and
        the caches' figures. Each is supervised: one that fails, or ends before ``stop``, is
        said once and sets ``stop`` (``failed`` says why): the service ends, and systemd
        starts it again."""
        supervisor = self._supervisor = Supervisor(stop, self._stopping_on_failure)
        start = supervisor.start
        tasks = [
            start(self.watch_power(stop), "power watch"),
            start(_every(60.0, self.open_platforms, stop), "platforms"),
            start(_every(15.0, self._retry_journal, stop), "journal"),
            start(_every(REPLAN_EVERY_S, self._refresh_plans, stop, first=False), "plans"),
            start(self._each_time(self._poll_wanted, self.poll_now), "changes"),
            start(self._each_time(self._hangup, self.reload), "reload"),
        ]
        self.runtime.listen(self.request_poll)
        if self.pair is not None:
            pair = self.pair
            tasks += [
                start(pair.leadership.run(), "leadership"),
                start(pair.write_in_order(), "shared ledger"),
                start(pair.follow(self._follow), "following"),
                start(
                    pair.share_views(
                        lambda: ups_seen(self.controller.watches),
                        lambda: self.controller.caches.owed,
                    ),
                    "views",
                ),
            ]
        if self.site.caches:
            tasks.append(start(_every(30.0, self.refresh_caches, stop), "caches"))
        return tasks

    def _stopping_on_failure(self, message: str) -> None:
        self.bus(Notice(self.clock.now(), message, level="error"))

    async def _start_web(self) -> WebServer | None:
        """The live page, when the site file asks for one. It is for people watching: one
        that cannot start is an alert, never a reason to stop watching the power."""
        if self.site.web is None:
            return None
        from upsguard.controller.web.server import WebServer

        try:
            page = WebServer(self, self.site.web)
            await page.start()
        except UpsguardError as exc:
            self.bus(Notice(self.clock.now(), f"no web page: {exc}", level="error"))
            return None
        self._page = page
        self.bus(Notice(self.clock.now(), f"web page on {page.url}"))
        return page

    async def close(self) -> None:
        """Let go of everything; a run in progress stays unfinished in the journal."""
        if self._runtime is not None:
            await self._runtime.close()
        for task in list(self._pair_tasks):
            task.cancel()
        await asyncio.gather(*self._pair_tasks, return_exceptions=True)
        if self.pair is not None:
            await _quietly(self.pair.store.close())
            await _quietly(self.pair.views_store.close())
        await self.notifier.drain()
        self.journal.close()
        self.lock.release()


async def run_service(site: SiteConfig, stop: asyncio.Event, path: Path | None = None) -> int:
    """``upsguard run``: until ``stop``; ``SIGHUP`` reads the site file at ``path`` again.
    The exit code: 0 once stopped as asked, 1 when a long-running task failed (said once
    already, as it happened)."""
    service = Service(site, site_path=path)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, service.request_reload)
    try:
        await service.open()
        await service.serve(stop)
    finally:
        await service.close()
    return 0 if service.failed is None else 1


def _log_event(event: Event) -> None:
    text = describe(event)
    if text is not None:
        event_log.log(logging.getLevelName(level(event).upper()), text.strip())


async def _every(
    period_s: float,
    job: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    first: bool = True,
    alive: Watchdog | None = None,
) -> None:
    """``job`` now (unless not ``first``), then every ``period_s`` on the loop's monotonic
    clock, until ``stop``; ``alive`` is petted after each job and at least every
    ``alive.every_s`` between two."""
    loop = asyncio.get_running_loop()
    skip = not first
    while not stop.is_set():
        started = loop.time()
        if not skip:
            await job()
        skip = False
        while not stop.is_set():
            if alive is not None:
                alive.pet()
            left = started + period_s - loop.time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left if alive is None else min(left, alive.every_s)):
                    await stop.wait()


async def _quietly(awaitable: object) -> None:
    try:
        await awaitable  # type: ignore[misc]
    except Exception as exc:  # closing must never stop the others from closing
        log.warning("closing: %s", exc)


def _socket_group_id(name: str | None) -> int | None:
    """The group the journal is shared with; a group that does not exist is the API's error
    to report, never a reason to keep the journal from opening."""
    if name is None:
        return None
    try:
        return group_id(name)
    except PermanentError:
        return None
