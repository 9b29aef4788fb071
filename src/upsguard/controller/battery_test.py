"""One battery test the service asks a UPS for, from its start to its journaled result.

The UPS is told ``test.battery.start.quick`` or ``.deep`` (``command``; SNMP sources send
their MIB's SETs). Until the test ends its watch takes the UPS's readings on battery for the
test's (``UpsWatch.expect_self_test``), so no feed goes at risk and nothing is shut down for
it; a low battery, FSD or the mains gone during the test are an outage as always, and the
test is stopped (``test.battery.stop``) when another UPS goes on battery meanwhile.

The result is what the UPS reports once it changed from what it said before the test
(``BatteryTests``), with the charge at both ends; a deep test gives the runtime the battery
would last at the drain seen during it. ``BatteryTestFinished`` journals all of it, and
each command sent (start, stop) is journaled with the UPS's answer (``UpsCommandSent``): a
UPS that refuses one says so in the report, not only in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from upsguard.clock import Clock
from upsguard.config.checks_schedule import BatteryTestConfig
from upsguard.engine.outage_controller import OutageController
from upsguard.errors import UpsguardError
from upsguard.events import BatteryTestFinished, BatteryTestStarted, EventSink, UpsCommandSent
from upsguard.models import UpsName
from upsguard.plugins.ups.base import BatteryTests, UpsSource
from upsguard.policies.power import self_test
from upsguard.policies.watch import UpsWatch
from upsguard.selftest import TestResult, TestState

log = logging.getLogger(__name__)

STOP = "test.battery.stop"


class BatteryTester:
    def __init__(
        self,
        controller: Callable[[], OutageController],
        clock: Clock,
        events: EventSink,
        poll_s: float,
    ) -> None:
        self._controller = controller
        self._clock = clock
        self._events = events
        self._poll_s = max(poll_s, 0.2)

    async def run(self, ups: UpsName, test: BatteryTestConfig) -> TestState:
        """Send the test, follow it to its end, journal it; the state it ended in."""
        watch = self._watch(ups)
        assert watch is not None, "the schedule tests the UPSes of the site file in force"
        source = watch.source
        started = self._clock.now()
        charge_start = watch.last.charge_pct if watch.last is not None else None
        before = await _result(source)
        deadline = self._clock.monotonic() + test.timeout.total_seconds()
        watch.expect_self_test(deadline)
        try:
            refused = await self._send(source, ups, test.command)
            if refused is not None:
                result = TestResult(TestState.UNKNOWN, f"not sent: {refused}")
            else:
                self._events(BatteryTestStarted(started, ups, test.kind))
                result = await self._follow(ups, before, deadline)
        finally:
            watch = self._watch(ups) or watch
            watch.expect_self_test(None)
        ended = self._clock.now()
        charge_end = watch.last.charge_pct if watch.last is not None else None
        observed = _runtime(test.kind, charge_start, charge_end, (ended - started).total_seconds())
        self._events(
            BatteryTestFinished(
                ended,
                ups,
                test.kind,
                started,
                result.state,
                result.text,
                charge_start,
                charge_end,
                observed,
            )
        )
        return result.state

    async def _follow(self, ups: UpsName, before: TestResult | None, deadline: float) -> TestResult:
        """Until the UPS reports a result that is not the one from before the test. The
        UPS is asked through the controller in force each time: a reload meanwhile closed
        the connection it was sent through."""
        seen_running = False
        while self._clock.monotonic() < deadline:
            await asyncio.sleep(self._poll_s)
            watch = self._watch(ups)
            if watch is None:
                return TestResult(TestState.UNKNOWN, "the site file read again has no such UPS")
            source = watch.source
            outage = self._outage_elsewhere(ups) or self._not_a_test(ups)
            if outage is not None:
                refused = await self._send(source, ups, STOP)
                if refused is not None:
                    log.warning("UPS %s: could not stop its battery test: %s", ups, refused)
                return TestResult(TestState.ABORTED, f"stopped by upsguard: {outage}")
            result = await _result(source)
            if result is None:
                continue
            seen_running = seen_running or result.state is TestState.RUNNING
            changed = before is None or result.text != before.text
            if result.state.finished and (seen_running or changed):
                return result
        return TestResult(TestState.UNKNOWN, "no result reported within the test's timeout")

    def _watch(self, ups: UpsName) -> UpsWatch | None:
        """The UPS's watch in the controller in force (a reload builds new ones); None once
        a reload took the UPS out of the site file."""
        return self._controller().watches.get(ups)

    async def _send(self, source: UpsSource, ups: UpsName, command: str) -> str | None:
        """Send ``command`` and journal the UPS's answer; None when it was taken, else why
        not."""
        try:
            await source.command(command)
        except UpsguardError as exc:
            why = str(exc) or type(exc).__name__
            self._events(UpsCommandSent(self._clock.now(), ups, command, False, why))
            return why
        self._events(UpsCommandSent(self._clock.now(), ups, command, True))
        return None

    def _outage_elsewhere(self, ups: UpsName) -> str | None:
        other = other_on_battery(self._controller(), ups)
        return None if other is None else f"UPS {other} went on battery"

    def _not_a_test(self, ups: UpsName) -> str | None:
        """The tested UPS itself on battery for something else: low, FSD, mains gone."""
        watch = self._watch(ups)
        reading = watch.last if watch is not None else None
        if reading is not None and reading.on_battery and not self_test(reading):
            return "on battery for real (low battery, FSD or no input voltage)"
        return None


def other_on_battery(controller: OutageController, ups: UpsName) -> UpsName | None:
    """Another UPS whose last reading says on battery: no time to test this one."""
    for name, watch in controller.watches.items():
        if name != ups and watch.last is not None and watch.last.on_battery:
            return name
    return None


async def _result(source: UpsSource) -> TestResult | None:
    if not isinstance(source, BatteryTests):
        return None
    try:
        return await source.battery_test_result()
    except UpsguardError as exc:
        log.warning("reading the battery test's result: %s", exc)
        return None


def _runtime(kind: str, start: float | None, end: float | None, seconds: float) -> float | None:
    """A deep test's drain, as the runtime it gives from a full charge: what ``upsguard
    battery`` sets beside its model. None for a quick test or without a charge drop."""
    if kind != "deep" or start is None or end is None or end >= start or seconds <= 0:
        return None
    return 100.0 / ((start - end) / seconds)
