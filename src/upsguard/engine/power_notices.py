"""What the power watch tells people beside its decisions: a UPS out of reach (or stale) and
back, a UPS raising a status flag a person must hear of (low battery, battery needs
replacing, overload, bypass) and clearing it, a feed on battery and back on mains, a feed
that lost its redundancy and got it back, a self-test. Each is one event when it changes, not
one a poll. Reporting only informs: it never raises into the tick that decides.

A feed going on battery carries its ``Outlook``: when its shutdown will start, as its
triggers and the plan stand then (``policies.outlook``), so that the alert can say what
upsguard will do next and when.

A feed has lost its redundancy when fewer of its UPSes supply from mains than it has, but
still ``min_supplies`` or more: nothing is at risk yet, and nothing is decided, but it is a
failure closer to going down (a UPS of two on battery for half an hour, draining). A member out
of contact counts as supplying here as it does for the feed (``policies.power``): its own
warning says it cannot be read.

A flag is told only from a live reading: a UPS that cannot be read has not cleared its flags
(unknown is never good news), it keeps them until it is read again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from upsguard.clock import Clock
from upsguard.config.policies import PoliciesConfig
from upsguard.config.site import FeedConfig
from upsguard.config.types import format_duration
from upsguard.decisions import NO_PLAN, Outlook, PlanTime
from upsguard.events import (
    ALERT_FLAGS,
    ContactBack,
    ContactLost,
    EventSink,
    Notice,
    OnBattery,
    PowerRestored,
    RedundancyBack,
    RedundancyLost,
    UpsFlagChanged,
    members_line,
)
from upsguard.models import LinkState, UpsFlag, UpsName, UpsReading
from upsguard.policies.outlook import outlook
from upsguard.policies.phases import PowerView
from upsguard.policies.power import FeedReading, self_test
from upsguard.policies.watch import STALE_ERROR, UpsWatch

log = logging.getLogger(__name__)


class PowerNotices:
    def __init__(
        self,
        feeds: Mapping[str, FeedConfig],
        clock: Clock,
        events: EventSink,
        policies: PoliciesConfig | None = None,
    ) -> None:
        """``policies``: the site's, for each feed's outlook; without them (a test of the
        notices alone) no outlook is told."""
        self._feeds = feeds
        self._clock = clock
        self._events = events
        self._policies = policies
        self._contact: dict[UpsName, str | None] = {}
        self._at_risk_since: dict[str, float | None] = {}
        self._degraded: dict[str, bool] = {}
        self._self_test: dict[UpsName, float] = {}
        self._flags: dict[UpsName, frozenset[UpsFlag]] = {}
        self._raised: list[tuple[UpsName, UpsFlag, bool]] = []
        """Flag changes read this poll, told once the feeds are read (a low battery says
        its feed's outlook)."""

    def readings(self, readings: Iterable[UpsReading], watches: Iterable[UpsWatch]) -> None:
        for reading in readings:
            _safely(self._self_test_of, reading)
            _safely(self._flags_of, reading)
        for watch in watches:
            _safely(self._contact_of, watch)

    def feeds(self, view: PowerView, plan_s: PlanSeconds | None = None) -> None:
        """``plan_s``: asked, only when an outlook is told, per feed what its shutdown would
        take from now (most polls tell none, and pay nothing for it)."""
        plans = _Plans(plan_s)
        for feed in view.feeds:
            _safely(self._feed, (feed, plans))
            _safely(self._redundancy_of, feed)
        _safely(self._tell_flags, (view, plans))

    def _self_test_of(self, reading: UpsReading) -> None:
        """A battery test is on battery on purpose: one event says so when it ends."""
        began = self._self_test.get(reading.ups)
        testing = reading.link is LinkState.OK and self_test(reading)
        if testing and began is None:
            self._self_test[reading.ups] = self._clock.monotonic()
        elif not testing and began is not None:
            del self._self_test[reading.ups]
            took = format_duration(self._clock.monotonic() - began)
            text = f"UPS {reading.ups} self-test: on battery {took}, ignored"
            self._events(Notice(self._clock.now(), text))

    def _flags_of(self, reading: UpsReading) -> None:
        """Each alert flag raised or cleared since the last live reading (the first reading
        tells only what is raised)."""
        if reading.link is not LinkState.OK:
            return
        now = frozenset(f for f in reading.flags if f in ALERT_FLAGS)
        before = self._flags.get(reading.ups, frozenset())
        self._flags[reading.ups] = now
        for flag in ALERT_FLAGS:
            if (flag in now) != (flag in before):
                self._raised.append((reading.ups, flag, flag in now))

    def _tell_flags(self, seen: tuple[PowerView, _Plans]) -> None:
        view, plans = seen
        raised, self._raised = self._raised, []
        for ups, flag, up in raised:
            told = self._outlook_of_ups(ups, view, plans) if up and flag is UpsFlag.LB else None
            self._events(UpsFlagChanged(self._clock.now(), ups, flag, up, told))

    def _outlook_of_ups(self, ups: UpsName, view: PowerView, plans: _Plans) -> Outlook | None:
        """The outlook of the feed at risk this UPS belongs to that fires first; None when
        none of its feeds is at risk (its low battery alone decides nothing)."""
        found = [
            self._outlook(feed, plans.of(feed.name))
            for feed in view.at_risk
            if ups in self._feeds[feed.name].ups
        ]
        known = [o for o in found if o is not None]
        if not known:
            return None
        return min(known, key=lambda o: (not o.due_now, o.fires_in_s is None, o.fires_in_s))

    def _outlook(self, feed: FeedReading, plan: PlanTime) -> Outlook | None:
        return None if self._policies is None else outlook(self._policies, feed, plan)

    def _contact_of(self, watch: UpsWatch) -> None:
        """A UPS that cannot be read is an alert (notified once), and so is its return."""
        error, before = watch.last_error, self._contact.get(watch.name)
        if error == before:
            return
        if error is not None:
            last = watch.last_ok
            on_battery = last is not None and last.on_battery and not self_test(last)
            stale = error == STALE_ERROR
            self._events(ContactLost(self._clock.now(), watch.name, error, stale, on_battery))
        elif before is not None:
            self._events(ContactBack(self._clock.now(), watch.name))
        self._contact[watch.name] = error

    def _feed(self, seen: tuple[FeedReading, _Plans]) -> None:
        """Each feed going on battery, and back on mains, is an event of its own."""
        feed, plans = seen
        now = self._clock.monotonic()
        since = self._at_risk_since.get(feed.name)
        if feed.at_risk and since is None:
            self._at_risk_since[feed.name] = now
            told = self._outlook(feed, plans.of(feed.name))
            self._events(OnBattery(self._clock.now(), feed.name, self._members(feed), told))
        elif since is not None and not feed.at_risk:
            self._at_risk_since[feed.name] = None
            self._events(PowerRestored(self._clock.now(), feed.name, now - since))

    def _redundancy_of(self, feed: FeedReading) -> None:
        """A feed left with fewer UPSes on mains than it has, but enough, is a warning (once);
        all of them on mains again is told too. Going at risk from there is ``OnBattery``'s."""
        degraded = not feed.at_risk and feed.online < len(feed.members)
        was = self._degraded.get(feed.name, False)
        self._degraded[feed.name] = degraded
        members = self._pairs(feed)
        if degraded and not was:
            self._events(
                RedundancyLost(self._clock.now(), feed.name, members, feed.online, feed.needed)
            )
        elif was and not degraded and not feed.at_risk:
            self._events(RedundancyBack(self._clock.now(), feed.name, members))

    def _pairs(self, feed: FeedReading) -> tuple[tuple[str, str], ...]:
        """Each UPS of the feed with its word (``ups-a on-battery``)."""
        ups = self._feeds[feed.name].ups
        return tuple((str(u), w) for u, w in zip(ups, feed.members, strict=False))

    def _members(self, feed: FeedReading) -> str:
        """Each UPS of the feed with its word (``ups-a on-battery, ups-b online``)."""
        return members_line(self._pairs(feed))


PlanSeconds = Callable[[], Mapping[str, PlanTime]]


class _Plans:
    """The feeds' plan times, asked of ``plan_s`` once, when first needed."""

    def __init__(self, plan_s: PlanSeconds | None) -> None:
        self._ask = plan_s
        self._got: Mapping[str, PlanTime] | None = None

    def of(self, feed: str) -> PlanTime:
        if self._got is None:
            self._got = self._ask() if self._ask is not None else {}
        return self._got.get(feed, NO_PLAN)


def _safely(report: Callable[[Any], None], subject: Any) -> None:
    """An event that only informs must never cost the tick its decisions."""
    try:
        report(subject)
    except Exception:
        log.exception("reporting %s failed", report.__name__)
