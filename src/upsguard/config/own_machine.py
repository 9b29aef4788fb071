"""Where upsguard's own machine gets its power, against what it guards.

The machine running upsguard must outlast what it protects: an outage that darkens it while
a host still runs leaves that host with nobody to shut it down when its own UPS runs low.
That happens when the controller hangs on a weaker feed than a protected resource: a UPS
(or a few) whose loss takes the controller's feed below its ``min_supplies`` while the
other feed still has enough. ``validate`` warns of it naming both feeds; the simulator
says from when a site is unguarded; the service says so before it stops itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from upsguard.config.site import FeedConfig, SiteConfig, feed_name
from upsguard.models import ResourceId, UpsName

MAX_UPS_LOST = 3
"""Outages of up to this many UPSes at once are looked at (a site has few UPSes; three
failing together is already rare)."""


@dataclass(frozen=True, slots=True)
class WeakerFeed:
    """An outage that takes the controller's machine down while a feed still powers what
    it protects."""

    own: ResourceId
    own_feeds: tuple[str, ...]
    feed: str
    """A feed that stays up."""
    ups: tuple[UpsName, ...]
    """The feed's UPSes."""
    needed: int
    lost: tuple[UpsName, ...]
    """The smallest outage found that does it."""
    left_on: tuple[ResourceId, ...]
    """What the feed still powers, with nothing to shut it down."""

    def said(self) -> str:
        own = ", ".join(self.own_feeds)
        return (
            f"{self.own}, the machine running upsguard, hangs on feed {own}, weaker than feed "
            f"{self.feed} ({', '.join(self.ups)}; {self.needed} needed): when "
            f"{' and '.join(self.lost)} fail{'s' if len(self.lost) == 1 else ''}, upsguard "
            f"goes down while {self.feed} still powers {', '.join(self.left_on)}, and nothing "
            f"guards them; power {self.own} from {self.feed}'s UPSes too (its 'powers' list)"
        )


def weaker_feeds(site: SiteConfig) -> list[WeakerFeed]:
    """Each feed that can outlast the controller's machine, with the smallest outage that
    shows it."""
    own = next((r for r in site.resources if r.runs_upsguard), None)
    if own is None:
        return []
    own_feeds = site.feeds_powering(own.id)
    if not own_feeds:
        return []
    mine = {id(f) for f in own_feeds}
    named = [(feed_name(f, i), f) for i, f in enumerate(site.effective_feeds())]
    guarded = [(n, f, _protected(site, f)) for n, f in named if id(f) not in mine]
    guarded = [(n, f, left) for n, f, left in guarded if left]
    own_names = tuple(n for n, f in named if id(f) in mine)
    upses = [u.name for u in site.ups]
    found: dict[str, WeakerFeed] = {}
    for lost in _outages(upses):
        if all(_powered(f, lost) for f in own_feeds):
            continue
        for name, feed, left in guarded:
            if name not in found and _powered(feed, lost):
                found[name] = WeakerFeed(
                    own.id, own_names, name, tuple(feed.ups), feed.min_supplies, lost, left
                )
    return list(found.values())


def without_a_way_back(site: SiteConfig) -> Iterator[tuple[int, str]]:
    """The UPSes powering upsguard's machine whose end command would not bring power back:
    after a shutdown on battery upsguard then stays up while the battery lasts rather than
    halt a machine nothing would start again. Each as its index in ``ups`` and why."""
    own = next((r for r in site.resources if r.runs_upsguard), None)
    if own is None:
        return
    powering = {u for f in site.feeds_powering(own.id) for u in f.ups}
    for i, ups in enumerate(site.ups):
        if ups.name not in powering or ups.at_shutdown_end.brings_power_back:
            continue
        command = ups.at_shutdown_end.command
        what = "no command" if command is None else f"{command}, which does not bring it back"
        yield (
            i,
            (
                f"UPS {ups.name} powers {own.id}, the machine running upsguard, and ends a "
                f"shutdown with {what}: upsguard will not halt its own machine (nothing "
                "would start it again) and stays up while the battery lasts; give it "
                "at_shutdown_end: {command: shutdown.return}"
            ),
        )


def _outages(upses: list[UpsName]) -> Iterator[tuple[UpsName, ...]]:
    """Every set of UPSes failing together, smallest first."""
    for size in range(1, min(len(upses), MAX_UPS_LOST) + 1):
        yield from itertools.combinations(upses, size)


def _powered(feed: FeedConfig, lost: tuple[UpsName, ...]) -> bool:
    return len(set(feed.ups) - set(lost)) >= feed.min_supplies


def _protected(site: SiteConfig, feed: FeedConfig) -> tuple[ResourceId, ...]:
    """What the feed powers that upsguard stops (not the controller's own machine)."""
    return tuple(
        r.id
        for r in site.resources
        if r.stops and not r.runs_upsguard and any(f is feed for f in site.feeds_of(r.id))
    )
