"""What the power watch tells people beside its decisions: a UPS out of reach (or stale) and
back, a feed on battery and back on mains, a feed that lost its redundancy and got it back,
a self-test. Each is one event when it changes, not one a poll. Reporting only informs: it
never raises into the tick that decides.

A feed has lost its redundancy when fewer of its UPSes supply from mains than it has, but
still ``min_supplies`` or more: nothing is at risk yet, and nothing is decided, but it is a
failure closer to going down (a UPS of two on battery for half an hour, draining). A member out
of contact counts as supplying here as it does for the feed (``policies.power``): its own
warning says it cannot be read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from upsguard.clock import Clock
from upsguard.config.site import FeedConfig
from upsguard.config.types import format_duration
from upsguard.events import EventSink, Notice, OnBattery, PowerRestored
from upsguard.models import LinkState, UpsName, UpsReading
from upsguard.policies.phases import PowerView
from upsguard.policies.power import FeedReading, self_test
from upsguard.policies.watch import UpsWatch

log = logging.getLogger(__name__)


class PowerNotices:
    def __init__(self, feeds: Mapping[str, FeedConfig], clock: Clock, events: EventSink) -> None:
        self._feeds = feeds
        self._clock = clock
        self._events = events
        self._contact: dict[UpsName, str | None] = {}
        self._at_risk: dict[str, bool] = {}
        self._degraded: dict[str, bool] = {}
        self._self_test: dict[UpsName, float] = {}

    def readings(self, readings: Iterable[UpsReading], watches: Iterable[UpsWatch]) -> None:
        for reading in readings:
            _safely(self._self_test_of, reading)
        for watch in watches:
            _safely(self._contact_of, watch)

    def feeds(self, view: PowerView) -> None:
        for feed in view.feeds:
            _safely(self._feed, feed)
            _safely(self._redundancy_of, feed)

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

    def _contact_of(self, watch: UpsWatch) -> None:
        """A UPS that cannot be read is an alert (notified once), and so is its return."""
        error, before = watch.last_error, self._contact.get(watch.name)
        if error == before:
            return
        if error is not None:
            text = f"UPS {watch.name} cannot be read: {error}"
            self._events(Notice(self._clock.now(), text, level="warning"))
        elif before is not None:
            self._events(Notice(self._clock.now(), f"UPS {watch.name} answers again"))
        self._contact[watch.name] = error

    def _feed(self, feed: FeedReading) -> None:
        """Each feed going on battery, and back on mains, is an event of its own."""
        was = self._at_risk.get(feed.name, False)
        if feed.at_risk and not was:
            self._events(OnBattery(self._clock.now(), feed.name, self._members(feed)))
        elif was and not feed.at_risk:
            self._events(PowerRestored(self._clock.now(), feed.name))
        self._at_risk[feed.name] = feed.at_risk

    def _redundancy_of(self, feed: FeedReading) -> None:
        """A feed left with fewer UPSes on mains than it has, but enough, is a warning (once);
        all of them on mains again is told too. Going at risk from there is ``OnBattery``'s."""
        degraded = not feed.at_risk and feed.online < len(feed.members)
        was = self._degraded.get(feed.name, False)
        self._degraded[feed.name] = degraded
        if degraded and not was:
            text = (
                f"feed {feed.name} has lost its redundancy: {self._members(feed)} "
                f"({feed.online} of {len(feed.members)} UPSes on mains, {feed.needed} needed)"
            )
            self._events(Notice(self._clock.now(), text, level="warning"))
        elif was and not degraded and not feed.at_risk:
            text = f"feed {feed.name} is redundant again: {self._members(feed)}"
            self._events(Notice(self._clock.now(), text))

    def _members(self, feed: FeedReading) -> str:
        """Each UPS of the feed with its word (``ups-a on-battery, ups-b online``)."""
        ups = self._feeds[feed.name].ups
        return ", ".join(f"{u} {w}" for u, w in zip(ups, feed.members, strict=False))


def _safely(report: Callable[[Any], None], subject: Any) -> None:
    """An event that only informs must never cost the tick its decisions."""
    try:
        report(subject)
    except Exception:
        log.exception("reporting %s failed", report.__name__)
