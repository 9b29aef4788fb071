"""A scenario as changes on the virtual clock: mains, contact with the UPSes, self-tests, FSD,
failing UPSes.

Each change is one loop callback at its scenario time; the world applies it. What is not a
change of the mains (those the engine's own events tell) carries a line for the timeline,
so that a person reading it sees the cause beside what upsguard made of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from upsguard.config.scenario import Scenario, Window
from upsguard.models import LinkState, UpsName
from upsguard.simulation.world import PowerWorld

Mains = Callable[[list[UpsName] | None, bool], None]
Apply = Callable[[list[UpsName] | None, bool], None]


@dataclass(frozen=True, slots=True)
class Change:
    at_s: float
    apply: Callable[[], None]
    note: str | None = None
    """The timeline's line for it (None for the mains)."""


def changes(scenario: Scenario, world: PowerWorld, mains: Mains) -> list[Change]:
    """Every change the scenario makes, in no particular order; ``mains`` sets the mains of
    some UPSes (None: all) on or off."""
    out: list[Change] = []
    sc = scenario

    def mains_at(at: float, ups: list[UpsName] | None, on: bool) -> None:
        out.append(Change(at, functools.partial(mains, ups, on)))

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
        link = LinkState(contact.state)
        what = "stops answering" if link is LinkState.LOST else "answers with stale data"
        apply = functools.partial(_set_link, world, link)
        out += _window(contact, apply, what, "answers again")
    for test in sc.self_test:
        out += _window(test, world.set_self_test, "starts a self-test", "ends its self-test")
    for fsd in sc.fsd:
        out += _window(fsd, world.set_fsd, "shows FSD (a NUT primary)", "no longer shows FSD")
    for name, behaviour in sc.ups.items():
        if behaviour.fails_at is not None:
            at = behaviour.fails_at.total_seconds()
            note = f"scenario: UPS {name} fails (output off, no answer)"
            out.append(Change(at, functools.partial(world.fail, name), note))
    for platform, given in sc.platforms.items():
        if given.hang is not None:
            hang = given.hang
            out.append(Change(hang.at.total_seconds(), _nothing, f"scenario: {platform} hangs"))
            if hang.duration is not None:
                end = (hang.at + hang.duration).total_seconds()
                out.append(Change(end, _nothing, f"scenario: {platform} answers again"))
    return out


def _nothing() -> None:
    """The platform hangs by itself (``SimulatedPlatform``'s ``Hang``): only the line."""


def _set_link(world: PowerWorld, link: LinkState, ups: list[UpsName] | None, on: bool) -> None:
    world.set_link(ups, link if on else LinkState.OK)


def _window(window: Window, apply: Apply, begins: str, ends: str) -> list[Change]:
    names = ", ".join(window.ups) if window.ups else "every UPS"
    start = window.at.total_seconds()
    out = [Change(start, functools.partial(apply, window.ups, True), f"scenario: {names} {begins}")]
    if window.duration is not None:
        end = start + window.duration.total_seconds()
        note = f"scenario: {names} {ends}"
        out.append(Change(end, functools.partial(apply, window.ups, False), note))
    return out
