"""The machine running upsguard, as the dry run sees it: while it is off, nothing acts.

A real controller that stops its own machine (or loses its power) does nothing more until
the machine boots again: the UPS's load cycle brings the power back, its firmware powers it
on, and the service starts and takes up what its journal says. The dry run plays the same:
from the moment the machine is off, the controller is not asked to do anything; once it is
on again (after ``BOOT_S``), it takes up where it stopped. What it leaves running meanwhile
is *unguarded*: nothing will shut it down when its UPS runs low.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.models import PowerState, ResourceId
from upsguard.simulation.world import PowerWorld

Note = Callable[[float, str, str], None]
"""Adds a line to the timeline: when, what, its kind."""


@dataclass
class Unguarded:
    """Protected resources left on while upsguard's machine was off."""

    from_s: float
    resources: tuple[ResourceId, ...]
    until_s: float | None = None


@dataclass
class ControllerMachine:
    site: SiteConfig
    clock: Clock
    world: PowerWorld
    guarded: Collection[ResourceId]
    """The hardware the shutdown stops: what must not be left running without upsguard."""
    note: Note
    up: bool = True
    booting: bool = False
    """Its power is back and its firmware powers it on."""
    went_down_s: list[float] = field(default_factory=list)
    came_back_s: list[float] = field(default_factory=list)
    unguarded: list[Unguarded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.own = next((r.id for r in self.site.resources if r.runs_upsguard), None)

    def power_changed(self, rid: ResourceId, state: PowerState) -> None:
        """Hears every power change of the simulated platforms (after the world did)."""
        if rid != self.own:
            return
        now = self.clock.monotonic()
        if state is PowerState.OFF and self.up:
            self.up = False
            self.went_down_s.append(now)
            self.note(now, f"upsguard's machine {rid} is off: nothing acts until it boots", "own")
            self._watch_unguarded(now)
        elif state is PowerState.ON and not self.up:
            self.up = True
            self.booting = False
            self.came_back_s.append(now)
            self.note(now, f"upsguard's machine {rid} boots: the controller takes up again", "own")
            for left in self.unguarded:
                if left.until_s is None:
                    left.until_s = now

    def _watch_unguarded(self, now: float) -> None:
        running = tuple(sorted(r for r in self.guarded if r != self.own and self.world.is_on(r)))
        if running:
            self.unguarded.append(Unguarded(now, running))
            names = ", ".join(running)
            self.note(now, f"unguarded: {names} run on with nothing to shut them down", "own")
