"""The service's calendar beside journal pruning: the scheduled checks and battery tests.

APScheduler runs them at wall-clock times (a test ``at: "Sun 03:00"`` is local time); the
power watch and its timeouts stay on the monotonic clock, untouched. Their schedules survive
restarts through the journal: the next checkup comes ``checks.every`` after the last one
journaled (or a minute after start when overdue), and a UPS is tested at the first ``at``
once ``battery_test.every`` has passed since its last journaled test.

Neither runs while the site is not normal or a run is under way: a checkup would log in
everywhere during an outage, and a battery test then would spend the runtime the shutdown
needs. A test is also not sent while another UPS is on battery, or this one is not on line.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.controller.battery_test import BatteryTester, other_on_battery
from upsguard.doctor.changes import compare
from upsguard.doctor.checkup import run_checkup
from upsguard.engine.outage_controller import OutageController
from upsguard.events import BatteryTestSkipped, CheckupDone, EventSink, Notice
from upsguard.journal import Journal
from upsguard.journal.checkups import battery_tests, last_checkup
from upsguard.models import Phase, UpsName

FIRST_AFTER = timedelta(minutes=1)
"""A checkup that is due (or has never run) runs this long after the service starts."""
EARLY = timedelta(hours=1)
"""A battery test this much short of ``every`` (the week's slot came early) is still due."""


class Schedule:
    def __init__(
        self,
        site: SiteConfig,
        clock: Clock,
        events: EventSink,
        journal: Journal,
        controller: Callable[[], OutageController],
    ) -> None:
        self.site = site
        self._clock = clock
        self._events = events
        self._journal = journal
        self._controller = controller
        poll_s = site.policies.poll_interval.total_seconds()
        self.tester = BatteryTester(controller, clock, events, poll_s)

    def add_jobs(self, sched: AsyncIOScheduler) -> list[str]:
        """Its jobs on the service's calendar; their ids (a reload removes them)."""
        ids: list[str] = []
        checks = self.site.checks
        if checks is not None:
            sched.add_job(
                self.checkup,
                IntervalTrigger(
                    seconds=checks.every.total_seconds(), start_date=self.next_checkup()
                ),
                id="checkup",
                max_instances=1,
                coalesce=True,
            )
            ids.append("checkup")
        for ups in self.site.ups:
            test = ups.battery_test
            if test is None:
                continue
            at = test.when
            sched.add_job(
                self.battery_test,
                CronTrigger(day_of_week=at.day or "*", hour=at.hour, minute=at.minute),
                args=[ups.name],
                id=f"battery test {ups.name}",
                max_instances=1,
                coalesce=True,
            )
            ids.append(f"battery test {ups.name}")
        return ids

    def next_checkup(self) -> datetime:
        """When the next checkup is due: ``every`` after the last journaled one, and at the
        soonest a minute from now."""
        assert self.site.checks is not None
        soonest = self._clock.now() + FIRST_AFTER
        last = last_checkup(self._journal.db)
        if last is None:
            return soonest
        return max(soonest, last[0] + self.site.checks.every)

    def _busy(self) -> str | None:
        controller = self._controller()
        if controller.busy:
            return "a run is under way"
        phase = controller.phase
        if phase is not Phase.NORMAL:
            return f"the site is {phase.value}"
        return None

    async def checkup(self) -> None:
        """The doctor's checks; journaled, with what broke since the last (an alert)."""
        busy = self._busy()
        if busy is not None:
            self._events(Notice(self._clock.now(), f"scheduled checks skipped: {busy}"))
            return
        assert self.site.checks is not None
        timeout = self.site.checks.timeout.total_seconds()
        result = await run_checkup(self.site, self._clock, timeout_s=timeout)
        before = last_checkup(self._journal.db)
        broke, mended = compare(before[1] if before else None, result.findings)
        event = CheckupDone(self._clock.now(), result.findings, broke, mended, result.took_s)
        self._events(event)

    async def battery_test(self, ups: UpsName) -> None:
        """The UPS's test, when due and nothing speaks against it now."""
        config = next(u for u in self.site.ups if u.name == ups)
        test = config.battery_test
        assert test is not None
        done = battery_tests(self._journal.db, ups, limit=1)
        now = self._clock.now()
        if done and now - done[0].started < test.every - EARLY:
            return  # tested since: the next slot will do
        why = self._busy() or self._other_on_battery(ups) or self._not_on_line(ups)
        if why is not None:
            self._events(BatteryTestSkipped(now, ups, test.kind, why))
            return
        await self.tester.run(ups, test)

    def _other_on_battery(self, ups: UpsName) -> str | None:
        other = other_on_battery(self._controller(), ups)
        return None if other is None else f"UPS {other} is on battery"

    def _not_on_line(self, ups: UpsName) -> str | None:
        reading = self._controller().watches[ups].last
        if reading is None or not reading.on_line:
            return f"UPS {ups} is not on line now"
        return None
