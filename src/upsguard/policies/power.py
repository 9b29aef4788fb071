"""From per-UPS readings to what a policy sees: feeds, and the site's worst feed.

A feed powers some resources from several UPSes; like NUT's MINSUPPLIES, it is
at risk only when fewer than ``min_supplies`` of them supply from mains. A UPS
supplies from mains when its live reading says on line, when it is on battery
only for a self-test (``CAL``), or while the watch holds it through a short
link loss (see ``policies.watch``). A UPS lost for longer, or stale, never
counts as on line.

While a feed is at risk it lasts as long as enough UPSes still deliver. Its members share
its load (one power supply on each): when the first on-battery member is empty, its share
moves to the survivors, whose runtimes shrink by Peukert's law (a UPS's
``peukert_exponent``), and so on until fewer than ``min_supplies`` are left. Each UPS's
runtime is the one it has at its share now; a member whose runtime is unknown counts as
gone now (its share moves at once), and one at 0 s has handed its share over already.

**Lost contact.** A UPS that stops answering (or was never read) while its last known
state was on mains is ``unknown``: with the default policy
(``on_lost_contact_while_on_line: alert``) it triggers nothing on its own and counts as
supplying, unless another member of the same feed has already failed; then it counts as
lost. A link flap or a broken UPS entry is an alert, not an outage (NUT's upsmon does the
same). ``treat_as_outage`` counts it as off line once its ``link_grace`` has passed. A UPS
lost while on battery always counts as draining, its runtime counted down from the last
known value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from upsguard.config.site import FeedConfig
from upsguard.config.site import feed_name as feed_name  # the name policies give a feed
from upsguard.models import LinkState, UpsFlag, UpsName, UpsReading

DEFAULT_PEUKERT = 1.15
"""A UPS's ``peukert_exponent`` when the site file gives none (lead-acid: 1.1 to 1.3)."""
MAINS_PRESENT_V = 80.0
"""Below this input voltage a UPS in self-test is taken as really on battery."""

LostContact = Literal["alert", "treat_as_outage"]


@dataclass(frozen=True, slots=True)
class FeedReading:
    name: str
    online: int
    needed: int
    runtime_s: float | None
    charge_pct: float | None
    depletion_pct_per_min: float | None
    low_battery: bool
    forced_shutdown: bool
    lost: bool
    """A member's data is lost or stale past its link grace (a held member is not lost)."""
    held: int = 0
    """Members counted as supplying only because a short link loss is being held."""
    at_risk_for_s: float = 0.0
    """How long the feed has been at risk without interruption; what ``on_battery.after``
    debounces (a short OB blip never reaches it)."""
    members: tuple[str, ...] = ()
    """One word per member UPS: ``online``, ``self-test``, ``held``, ``on-battery``, ``lost``,
    ``stale`` or ``unknown`` (lost contact while on mains, or never read), in the feed's
    order."""
    unknown: int = 0
    """Members out of contact since they were last seen on mains (alerts, not outages)."""
    read_on_mains: int = 0
    """Members whose live reading says on mains now (not held, not out of contact)."""

    @property
    def at_risk(self) -> bool:
        return self.online < self.needed

    @property
    def mains_seen(self) -> bool:
        """Enough members read on mains now, and no FSD: the mains are there, as seen, not
        as assumed of a UPS out of contact or held through a blip."""
        return self.read_on_mains >= self.needed and not self.forced_shutdown

    @property
    def state(self) -> str:
        """One word for people: ``online``, ``degraded`` (a member is off line but enough
        supply), ``unknown`` (a member is out of contact), ``at-risk`` or ``low-battery``."""
        if self.at_risk:
            return "low-battery" if self.low_battery or self.forced_shutdown else "at-risk"
        if self.forced_shutdown:
            return "low-battery"
        if self.unknown:
            return "unknown"
        return "degraded" if self.online < len(self.members) else "online"


@dataclass(frozen=True, slots=True)
class UpsFigures:
    """One UPS's reading with the watch's derived figures."""

    reading: UpsReading
    runtime_s: float | None
    depletion_pct_per_min: float | None
    held_online: bool = False
    off_line_for_s: float = 0.0
    last_seen_on_mains: bool = True
    """Its last live reading said on mains (or there never was one)."""
    peukert: float = DEFAULT_PEUKERT
    """How its runtime shrinks under more load: ``runtime * (load / new_load) ** peukert``
    (the UPS entry's ``peukert_exponent``)."""

    @property
    def supplying(self) -> bool:
        """Counts toward ``min_supplies``: on mains, or held through a short link loss."""
        return self.held_online or on_mains(self.reading)

    @property
    def unknown(self) -> bool:
        """Out of contact (past its grace) since it was last seen on mains, or never read."""
        return (
            self.reading.link is not LinkState.OK
            and not self.held_online
            and self.last_seen_on_mains
        )

    @property
    def word(self) -> str:
        reading = self.reading
        if reading.link is LinkState.OK:
            if reading.on_line:
                return "online"
            return "self-test" if self_test(reading) else "on-battery"
        if self.held_online:
            return "held"
        return "unknown" if self.unknown else reading.link.value


def self_test(reading: UpsReading) -> bool:
    """A battery test or calibration while mains is there: on battery on purpose."""
    if UpsFlag.CAL not in reading.flags or reading.low_battery or reading.forced_shutdown:
        return False
    return reading.input_voltage is None or reading.input_voltage >= MAINS_PRESENT_V


def on_mains(reading: UpsReading) -> bool:
    """Live and supplied from mains: on line, or on battery only for a self-test."""
    return reading.link is LinkState.OK and (reading.on_line or self_test(reading))


def read_feed(
    name: str,
    feed: FeedConfig,
    figures: Mapping[UpsName, UpsFigures],
    lost_contact: LostContact = "alert",
) -> FeedReading:
    members = [figures[u] for u in feed.ups if u in figures]
    supplying = [f for f in members if f.supplying]
    failed = [f for f in members if not f.supplying and not f.unknown]
    unknown = [f for f in members if f.unknown]
    if lost_contact == "alert" and not failed:
        supplying += unknown  # lost contact alone is no outage
    draining = [f for f in members if f not in supplying]
    online = len(supplying)
    at_risk = online < feed.min_supplies
    charges = [f.reading.charge_pct for f in draining if f.reading.charge_pct is not None]
    rates = [f.depletion_pct_per_min for f in draining if f.depletion_pct_per_min is not None]
    healthy = online + sum(1 for f in draining if not f.reading.low_battery)
    return FeedReading(
        name=name,
        online=online,
        needed=feed.min_supplies,
        runtime_s=_feed_runtime(feed, online, draining) if at_risk else None,
        charge_pct=min(charges) if charges else None,
        depletion_pct_per_min=max(rates) if rates else None,
        low_battery=at_risk and healthy < feed.min_supplies,
        forced_shutdown=any(f.reading.forced_shutdown for f in members),
        lost=any(f.reading.link is not LinkState.OK for f in draining),
        held=sum(1 for f in members if f.held_online),
        at_risk_for_s=_at_risk_for(feed, draining) if at_risk else 0.0,
        members=tuple(figures[u].word if u in figures else "unknown" for u in feed.ups),
        unknown=len(unknown) + sum(1 for u in feed.ups if u not in figures),
        read_on_mains=sum(1 for f in members if on_mains(f.reading)),
    )


def _feed_runtime(feed: FeedConfig, online: int, draining: list[UpsFigures]) -> float | None:
    """When fewer than ``min_supplies`` members will still deliver, each member's share of
    the load moving to the survivors as it empties (see the module docstring). None when too
    few runtimes are known to tell."""
    needed = feed.min_supplies - online  # on-battery members that must still deliver
    known = [f for f in draining if f.runtime_s is not None]
    if needed > len(known):
        return 0.0 if len(known) == len(draining) else None
    unknown = len(draining) - len(known)
    left = [(f.runtime_s, f.peukert) for f in known if f.runtime_s]  # at 0 s: handed over
    live = online + len(left) + unknown
    left = _shares_move(left, live, live - unknown)
    live -= unknown
    elapsed = 0.0
    while len(left) >= needed:
        (first, _), left = left[0], left[1:]
        elapsed += first
        left = _shares_move([(runtime - first, k) for runtime, k in left], live, live - 1)
        live -= 1
    return elapsed


def _shares_move(
    left: list[tuple[float, float]], live: int, now_live: int
) -> list[tuple[float, float]]:
    """The load ``live`` members shared is carried by ``now_live`` of them: each lasts
    ``(now_live / live) ** peukert`` as long. Runtimes and exponents, shortest first."""
    ratio = now_live / live if 0 < now_live < live else 1.0
    return sorted((runtime * ratio**k, k) for runtime, k in left)


def _at_risk_for(feed: FeedConfig, draining: list[UpsFigures]) -> float:
    """The feed went at risk when its k-th member went off line, k = members - needed + 1."""
    k = len(feed.ups) - feed.min_supplies + 1
    off = sorted((f.off_line_for_s for f in draining), reverse=True)
    off += [0.0] * (len(feed.ups) - len(off))
    return off[k - 1] if 0 < k <= len(off) else 0.0


def read_feeds(
    feeds: Sequence[FeedConfig],
    figures: Mapping[UpsName, UpsFigures],
    lost_contact: LostContact = "alert",
) -> list[FeedReading]:
    return [read_feed(feed_name(f, i), f, figures, lost_contact) for i, f in enumerate(feeds)]
