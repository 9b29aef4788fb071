"""A scenario as changes on the virtual clock: mains, contact with the UPSes, self-tests, FSD,
failing UPSes.

Each change is one loop callback at its scenario time; the world applies it. The simulator
runs until the last change is behind it and nothing more will happen.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass

from upsguard.config.scenario import Scenario, Window
from upsguard.models import LinkState, UpsName
from upsguard.simulation.world import PowerWorld

Mains = Callable[[list[UpsName] | None, bool], None]


@dataclass(frozen=True, slots=True)
class Change:
    at_s: float
    apply: Callable[[], None]


def changes(scenario: Scenario, world: PowerWorld, mains: Mains) -> list[Change]:
    """Every change the scenario makes, in no particular order; ``mains`` sets the mains of
    some UPSes (None: all) on or off."""
    out: list[Change] = []
    sc = scenario

    def mains_at(at: float, ups: list[UpsName] | None, on: bool) -> None:
        out.append(Change(at, lambda: mains(ups, on)))

    if sc.outage is not None:
        start = sc.outage.at.total_seconds()
        mains_at(start, sc.outage.ups, False)
        if sc.outage.duration is not None:
            mains_at(start + sc.outage.duration.total_seconds(), sc.outage.ups, True)
    for event in sc.power:
        mains_at(event.at.total_seconds(), event.ups, event.state == "online")
    for flap in sc.flapping:
        at, on = flap.start.total_seconds(), False
        while at < flap.stop.total_seconds():
            mains_at(at, flap.ups, on)
            at, on = at + flap.every.total_seconds(), not on
        mains_at(flap.stop.total_seconds(), flap.ups, True)
    for contact in sc.contact:
        out += _window(contact, functools.partial(_set_link, world, LinkState(contact.state)))
    for test in sc.self_test:
        out += _window(test, world.set_self_test)
    for fsd in sc.fsd:
        out += _window(fsd, world.set_fsd)
    for name, behaviour in sc.ups.items():
        if behaviour.fails_at is not None:
            at = behaviour.fails_at.total_seconds()
            out.append(Change(at, functools.partial(world.fail, name)))
    return out


def _set_link(world: PowerWorld, link: LinkState, ups: list[UpsName] | None, on: bool) -> None:
    world.set_link(ups, link if on else LinkState.OK)


def _window(
    window: Window, apply: Callable[[list[UpsName] | None, bool], None]
) -> list[Change]:
    start = window.at.total_seconds()
    out = [Change(start, lambda: apply(window.ups, True))]
    if window.duration is not None:
        end = start + window.duration.total_seconds()
        out.append(Change(end, lambda: apply(window.ups, False)))
    return out


def schedule(loop: asyncio.AbstractEventLoop, planned: list[Change]) -> float:
    """Put the changes on the loop; returns the time of the last one."""
    for change in planned:
        loop.call_later(change.at_s, change.apply)
    return max((c.at_s for c in planned), default=0.0)
