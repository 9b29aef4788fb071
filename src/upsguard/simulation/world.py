"""The simulator's physical world: mains per UPS, batteries, the load they carry, and what
each UPS says about it.

It plays the part of the UPSes (``SimulatedUps`` reads from it) and hears every power change
of the simulated platforms, so the load, and with it the runtime left, follow the runbook as
it runs.

A UPS whose battery runs empty, or that fails, is *dead*: its output is off and its share of
every load moves to the live UPSes of the same feeds. A feed with fewer live UPSes than its
``min_supplies`` has no power; a resource loses power when one of its feeds does (as the
engine counts it: a resource is at risk when any feed powering it is). A protected resource
(one the shutdown plan stops) that loses power while still on is what the verdict calls
running out; a switch that goes dark after the shutdown is not.

What a UPS *says* can differ from what it does, as in the scenario: it may stop answering
(``lost``), answer with old values (``stale``), run a self-test (``CAL``), carry FSD from a
NUT primary, or overstate its runtime.

A UPS carries out its instant commands as NUT describes them: ``load.off`` cuts the output
now; ``load.off.delay`` and ``shutdown.stayoff`` after the UPS entry's delay, for good; a
load cycle (``shutdown.return``, ``shutdown.reboot``) after the delay, and brings the output
back once the mains are there (after ``RETURN_DELAY_S``), mains back already or not. What
loses power goes off (``power_cut``); when power comes back, the machine running upsguard
boots (``power_back``): its firmware must power it on with the mains, or nothing would
start the site again. Everything else waits for the startup runbook.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from upsguard.clock import LoopClock
from upsguard.config.resources import ResourceConfig
from upsguard.config.scenario import Scenario, runtime_at_missing
from upsguard.config.site import SiteConfig
from upsguard.config.ups import LOAD_CYCLE_COMMANDS
from upsguard.errors import ConfigError, NoAnswer
from upsguard.models import (
    LinkState,
    PowerState,
    ResourceId,
    UpsFlag,
    UpsName,
    UpsReading,
)
from upsguard.simulation.battery import Battery

MAINS_V = 230.0
RETURN_DELAY_S = 30.0
"""How long a UPS whose output a load cycle cut waits for steady mains before it powers its
outlets again (NUT's ``ondelay``; usbhid-ups's default)."""

Supply = tuple[tuple[UpsName, ...], int]
"""One feed of a resource: its UPSes and how many of them must deliver."""


@dataclass(frozen=True, slots=True)
class PowerLoss:
    """Protected resources that lost power while still on: the battery did not last."""

    at_s: float
    ups: UpsName
    why: str
    resources: tuple[ResourceId, ...]


@dataclass(frozen=True, slots=True)
class UpsCommand:
    """An instant command a UPS received."""

    at_s: float
    ups: UpsName
    command: str


PowerChange = Callable[[tuple[ResourceId, ...]], None]


class PowerWorld:
    def __init__(
        self,
        site: SiteConfig,
        scenario: Scenario,
        clock: LoopClock,
        protected: Collection[ResourceId] = (),
    ) -> None:
        """``protected``: the resources the shutdown plan stops (losing power while on is
        running out; the rest goes down with the UPS by design)."""
        self._site = site
        self._clock = clock
        self._configs = {u.name: u for u in site.ups}
        self.batteries = {u.name: self._battery(site, scenario, u.name) for u in site.ups}
        self.mains = {u.name: True for u in site.ups}
        self.dead: dict[UpsName, str] = {}
        """UPSes whose output is off, and why (``ran empty``, ``failed``)."""
        self.failed: set[UpsName] = set()
        self.link = {u.name: LinkState.OK for u in site.ups}
        self.self_test = {u.name: False for u in site.ups}
        self.fsd = {u.name: False for u in site.ups}
        self._overstates = {name: b.overstates_runtime for name, b in scenario.ups.items()}
        self._all_ups = tuple(u.name for u in site.ups)
        self._protected = frozenset(protected)
        self._changes = 0  # counts moves of the clock and of the load, for snapshot()
        self._by_feeds: dict[tuple[int, ...], tuple[Supply, ...]] = {}
        self._supplies = {r.id: self._supplies_of(r) for r in site.resources}
        self._watts = {r.id: r.watts for r in site.resources}
        self._on = {r.id: 1.0 for r in site.resources}
        """The part of each resource that is on (a group's members go down one by one)."""
        self.load: dict[UpsName, float] = {}
        self._recount()
        self._last = clock.monotonic()
        self.depleted_at: dict[UpsName, float] = {}
        self.losses: list[PowerLoss] = []
        self.commands: list[UpsCommand] = []
        self.power_cut: PowerChange | None = None
        """Hears the resources that lost power (they are off now)."""
        self.power_back: PowerChange | None = None
        """Hears the machines that boot when their power returns (upsguard's own, and its
        pair's: their firmware powers them on with the mains)."""
        self._returning: set[UpsName] = set()
        self._cycling: set[UpsName] = set()
        peer = site.ha.peer_machine if site.ha is not None else None
        self._boots = frozenset(r.id for r in site.resources if r.runs_upsguard or r.id == peer)
        self._snapshot: tuple[int, dict[UpsName, tuple[float, float]]] | None = None

    @staticmethod
    def _battery(site: SiteConfig, scenario: Scenario, name: UpsName) -> Battery:
        index = [u.name for u in site.ups].index(name)
        ups = site.ups[index]
        if ups.runtime_at is None:  # load_scenario reports it first, with file:line
            raise ConfigError(runtime_at_missing(site, index))
        behaviour = scenario.ups.get(name)
        health = behaviour.battery_health if behaviour else 1.0
        charge = behaviour.start_charge if behaviour else 100.0
        return Battery(
            runtime_ref_s=ups.runtime_at.minutes * 60.0 * health,
            load_ref_w=ups.runtime_at.load_watts,
            peukert=ups.peukert_exponent,
            soc=charge / 100.0,
            recharge_s=scenario.recharge.total_seconds(),
        )

    def _supplies_of(self, res: ResourceConfig) -> tuple[Supply, ...]:
        """The feeds a resource hangs on (worked out once per set of them); without any,
        each UPS alone, as the engine counts it."""
        feeds = self._site.feeds_powering(res.id)
        if not feeds:
            return _each_alone(self._all_ups)
        key = tuple(sorted({id(f) for f in feeds}))
        if key not in self._by_feeds:
            self._by_feeds[key] = tuple((tuple(f.ups), f.min_supplies) for f in feeds)
        return self._by_feeds[key]

    def _live(self, supplies: tuple[Supply, ...]) -> tuple[UpsName, ...]:
        """The live UPSes among a resource's feeds, each once, in a stable order."""
        names = dict.fromkeys(u for ups, _ in supplies for u in ups if u not in self.dead)
        return tuple(names)

    def _recount(self) -> None:
        """Every UPS's load from scratch: at the start, and when a UPS dies or comes back."""
        self._changes += 1
        self.load = {
            name: 0.0 if name in self.dead else self._configs[name].other_load_watts
            for name in self._all_ups
        }
        for rid, supplies in self._supplies.items():
            self._add_load(rid, self._watts[rid] * self._on[rid], supplies)

    def _add_load(self, rid: ResourceId, watts: float, supplies: tuple[Supply, ...]) -> None:
        live = self._live(supplies) if self.dead else _union(supplies)
        for ups, share in _equal_shares(live):
            self.load[ups] = max(0.0, self.load[ups] + watts * share)

    # -- what the simulated plugins call ----------------------------------------------------

    def power_changed(self, rid: ResourceId, fraction: float, state: PowerState) -> None:
        self.advance()
        self._changes += 1
        sign = 1.0 if state is PowerState.ON else -1.0
        on = min(1.0, max(0.0, self._on[rid] + sign * fraction))
        self._on[rid] = 0.0 if on < 1e-9 else on  # thirds of a group add up to 1 - 1e-16
        self._add_load(rid, sign * self._watts[rid] * fraction, self._supplies[rid])

    def is_on(self, resource: ResourceId) -> bool:
        """Some of the resource is on (a group's members go down one by one)."""
        return self._on.get(resource, 0.0) > 0

    def set_mains(self, names: Iterable[UpsName] | None, on: bool) -> None:
        self.advance()
        for name in names or list(self.mains):
            self.mains[name] = on
            if on and self.dead.get(name) == "ran empty":  # it comes back with the mains
                self.depleted_at.pop(name, None)
                self._revive(name)
            elif on and name in self._returning:
                self._return_later(name)

    def command(self, ups: UpsName, command: str, delay_s: float) -> None:
        """An instant command, carried out as the module docstring says."""
        now = self._clock.monotonic()
        self.commands.append(UpsCommand(now, ups, command))
        if command == "load.off":
            self._cut(ups, returns=False)
        elif command in LOAD_CYCLE_COMMANDS or command in ("load.off.delay", "shutdown.stayoff"):
            returns = command in LOAD_CYCLE_COMMANDS
            if returns:
                self._cycling.add(ups)
            self._clock.loop.call_later(delay_s, self._cut, ups, returns)

    def powers_again(self, ups: UpsName) -> bool:
        """The UPS's output is off now and comes back by itself: a load cycle, or an empty
        battery (back with the mains)."""
        return ups in self._cycling or self.dead.get(ups) == "ran empty"

    def cycling(self, ups: UpsName) -> bool:
        """The UPS was told a load cycle and has not brought its output back yet: it will."""
        return ups in self._cycling

    def ups_of(self, resource: ResourceId) -> tuple[UpsName, ...]:
        """Every UPS that powers a resource, through its feeds or its hosts' feeds."""
        return _union(self._supplies[resource])

    def _cut(self, ups: UpsName, returns: bool) -> None:
        self.advance()
        if self.dead.get(ups) == "ran empty":  # already dark: the cycle returns with the mains
            self.dead[ups] = "switched off by a command"
        self._die(ups, "switched off by a command", self._clock.monotonic())
        if returns:
            self._returning.add(ups)
            if self.mains[ups]:
                self._return_later(ups)

    def _return_later(self, ups: UpsName) -> None:
        self._clock.loop.call_later(RETURN_DELAY_S, self._output_back, ups)

    def _output_back(self, ups: UpsName) -> None:
        """The load cycle's return, unless the mains left again (it waits for them)."""
        if ups in self._returning and self.mains[ups]:
            self._returning.discard(ups)
            self._cycling.discard(ups)
            self._revive(ups)

    def _revive(self, name: UpsName) -> None:
        """A dead UPS powers its outlets again: the loads move back, and the machine running
        upsguard boots."""
        self.advance()
        del self.dead[name]
        self._recount()
        booted = tuple(sorted(r for r in self._boots if self._powered(self._supplies[r])))
        if booted and self.power_back is not None:
            self.power_back(booted)

    def set_link(self, names: Iterable[UpsName] | None, link: LinkState) -> None:
        """The scenario's contact with a UPS (what it says, not what it does)."""
        for name in names or self._all_ups:
            self.link[name] = link

    def set_self_test(self, names: Iterable[UpsName] | None, on: bool) -> None:
        self.advance()
        for name in names or self._all_ups:
            self.self_test[name] = on

    def set_fsd(self, names: Iterable[UpsName] | None, on: bool) -> None:
        for name in names or self._all_ups:
            self.fsd[name] = on

    def fail(self, name: UpsName) -> None:
        """The UPS itself fails: output off, no answer, for good."""
        self.advance()
        self.failed.add(name)
        self._die(name, "failed", self._clock.monotonic())

    def advance(self) -> None:
        now = self._clock.monotonic()
        elapsed = now - self._last
        self._last = now
        if elapsed <= 0:
            return
        self._changes += 1
        emptied = []
        for name, battery in self.batteries.items():
            if name in self.dead:
                if self.mains[name] and name not in self.failed:
                    battery.charge(elapsed)
                continue
            if self.mains[name] and not self.self_test[name]:
                battery.charge(elapsed)
                continue
            empty_after = battery.drain(self.load[name], elapsed)
            if empty_after is not None:
                emptied.append((name, now - elapsed + empty_after))
        for name, at in emptied:
            self.depleted_at[name] = at
            self._die(name, "ran empty", at)

    def _die(self, name: UpsName, why: str, at: float) -> None:
        """A UPS's output goes off: its loads move to the live UPSes of their feeds, and
        what has no live supply left loses power."""
        if name in self.dead:
            return
        self.dead[name] = why
        self._recount()
        dark = sorted(
            rid
            for rid, supplies in self._supplies.items()
            if self._on[rid] > 0 and not self._powered(supplies)
        )
        lost = tuple(rid for rid in dark if rid in self._protected)
        if lost:
            self.losses.append(PowerLoss(at, name, why, lost))
        if dark and self.power_cut is not None:
            self.power_cut(tuple(dark))

    def _powered(self, supplies: tuple[Supply, ...]) -> bool:
        return all(sum(1 for u in ups if u not in self.dead) >= needed for ups, needed in supplies)

    # -- what the battery says ----------------------------------------------------------------

    def runtime_s(self, name: UpsName) -> float:
        if name in self.dead:
            return 0.0
        return self.batteries[name].runtime_s(self.load[name])

    def runtime_at_s(self, name: UpsName, load_w: float) -> float:
        """The runtime the battery has left at another load than its own now."""
        return 0.0 if name in self.dead else self.batteries[name].runtime_s(load_w)

    def reading(self, ups: UpsName) -> UpsReading:
        """What the UPS says now; raises ``NoAnswer`` when it does not answer."""
        self.advance()
        if ups in self.failed or self.link[ups] is LinkState.LOST:
            why = "failed" if ups in self.failed else "lost contact"
            raise NoAnswer(f"UPS {ups}: no answer ({why}, scenario)")
        if self.link[ups] is LinkState.STALE:  # as upsd says it: no values, an error
            raw = {"nut.error": "DATA-STALE (scenario)"}
            return UpsReading(ups=ups, at=self._clock.now(), link=LinkState.STALE, raw=raw)
        return self._reading(ups)

    def _reading(self, ups: UpsName) -> UpsReading:
        battery = self.batteries[ups]
        config = self._configs[ups]
        runtime = self.runtime_s(ups)
        on_battery = not self.mains[ups] or self.self_test[ups]
        flags = {UpsFlag.OB, UpsFlag.DISCHRG} if on_battery else {UpsFlag.OL, UpsFlag.CHRG}
        if not on_battery and battery.soc >= 1.0:
            flags.discard(UpsFlag.CHRG)
        if self.self_test[ups]:
            flags.add(UpsFlag.CAL)
        low = battery.charge_pct <= config.low_battery_charge or (
            runtime <= config.low_battery_runtime.total_seconds()
        )
        if low and not self.mains[ups]:
            flags.add(UpsFlag.LB)
        if self.fsd[ups]:
            flags.add(UpsFlag.FSD)
        if ups in self.dead:
            flags = {UpsFlag.OFF}
        return UpsReading(
            ups=ups,
            at=self._clock.now(),
            flags=frozenset(flags),
            charge_pct=round(battery.charge_pct, 1),
            runtime_s=round(runtime * self._overstates.get(ups, 1.0)),
            load_pct=None,
            input_voltage=MAINS_V if self.mains[ups] else 0.0,
        )

    def snapshot(self) -> dict[UpsName, tuple[float, float]]:
        """Per UPS: charge %, runtime left (s), as of now.

        Many events share one virtual instant: the figures are computed once per
        instant and load, not once per event, and the same dict is returned until
        they change (it is never changed in place, so timeline moments share it).
        """
        self.advance()
        if self._snapshot is None or self._snapshot[0] != self._changes:
            figures = {
                name: (b.charge_pct, self.runtime_s(name)) for name, b in self.batteries.items()
            }
            self._snapshot = (self._changes, figures)
        return self._snapshot[1]


def _each_alone(names: tuple[UpsName, ...]) -> tuple[Supply, ...]:
    return tuple(((name,), 1) for name in names)


@functools.lru_cache(maxsize=256)
def _union(supplies: tuple[Supply, ...]) -> tuple[UpsName, ...]:
    """Thousands of VMs share the same few feeds: their UPSes worked out once per set."""
    return tuple(dict.fromkeys(u for ups, _ in supplies for u in ups))


@functools.lru_cache(maxsize=256)
def _equal_shares(names: tuple[UpsName, ...]) -> tuple[tuple[UpsName, float], ...]:
    """Thousands of VMs share the same few UPS sets: worked out once per set."""
    return tuple((u, 1.0 / len(names)) for u in names)
