"""From per-UPS readings to what a policy sees: feeds, and the site's worst feed.

A feed powers some resources from several UPSes; like NUT's MINSUPPLIES, it is
at risk only when fewer than ``min_supplies`` of them are on line. A UPS whose
link is not ok never counts as on line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from upsguard.config.site import FeedConfig
from upsguard.models import UpsName, UpsReading


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

    @property
    def at_risk(self) -> bool:
        return self.online < self.needed


@dataclass(frozen=True, slots=True)
class UpsFigures:
    """One UPS's reading with the watch's derived figures."""

    reading: UpsReading
    runtime_s: float | None
    depletion_pct_per_min: float | None


def feed_name(feed: FeedConfig, index: int) -> str:
    return feed.name or f"feed{index}:" + "+".join(feed.ups)


def read_feed(name: str, feed: FeedConfig, figures: Mapping[UpsName, UpsFigures]) -> FeedReading:
    members = [figures[u] for u in feed.ups if u in figures]
    online = sum(1 for f in members if f.reading.on_line)
    supplying = [f for f in members if not f.reading.on_line]
    # The feed lasts until fewer than min_supplies UPSes still deliver: the needed-th longest.
    runtimes = sorted((f.runtime_s for f in members if f.runtime_s is not None), reverse=True)
    index = max(0, feed.min_supplies - online - 1)
    runtime = runtimes[index] if online < feed.min_supplies and index < len(runtimes) else None
    charges = [f.reading.charge_pct for f in supplying if f.reading.charge_pct is not None]
    rates = [f.depletion_pct_per_min for f in supplying if f.depletion_pct_per_min is not None]
    healthy = sum(1 for f in members if f.reading.on_line or not f.reading.low_battery)
    return FeedReading(
        name=name,
        online=online,
        needed=feed.min_supplies,
        runtime_s=runtime,
        charge_pct=min(charges) if charges else None,
        depletion_pct_per_min=max(rates) if rates else None,
        low_battery=online < feed.min_supplies and healthy < feed.min_supplies,
        forced_shutdown=any(f.reading.forced_shutdown for f in members),
        lost=any(f.reading.link.value != "ok" for f in members),
    )


def read_feeds(
    feeds: Sequence[FeedConfig], figures: Mapping[UpsName, UpsFigures]
) -> list[FeedReading]:
    return [read_feed(feed_name(f, i), f, figures) for i, f in enumerate(feeds)]
