"""The simulator's physical world: mains per UPS, batteries, and the load they carry.

It plays the part of the UPSes (``SimulatedUps`` reads from it) and hears
every power change of the simulated platforms, so the load, and with it the
runtime left, follow the runbook as it runs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from upsguard.clock import LoopClock
from upsguard.config.resources import ResourceConfig
from upsguard.config.scenario import Scenario, runtime_at_missing
from upsguard.config.site import FeedConfig, SiteConfig
from upsguard.errors import ConfigError
from upsguard.models import PowerState, ResourceId, UpsFlag, UpsName, UpsReading
from upsguard.simulation.battery import Battery


class PowerWorld:
    def __init__(self, site: SiteConfig, scenario: Scenario, clock: LoopClock) -> None:
        self._site = site
        self._clock = clock
        self.batteries = {u.name: self._battery(site, scenario, u.name) for u in site.ups}
        self.mains = {u.name: True for u in site.ups}
        self.load = {u.name: u.other_load_watts for u in site.ups}
        self._all_ups = tuple(u.name for u in site.ups)
        self._changes = 0  # counts moves of the clock and of the load, for snapshot()
        self._by_hosts: dict[tuple[ResourceId, ...], tuple[tuple[UpsName, float], ...]] = {}
        self._shares = {r.id: self._shares_of(r) for r in site.resources}
        self._watts = {r.id: r.watts for r in site.resources}
        for rid, watts in self._watts.items():
            for ups, share in self._shares[rid]:
                self.load[ups] += watts * share
        self._last = clock.monotonic()
        self.depleted_at: dict[UpsName, float] = {}
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

    def _shares_of(self, res: ResourceConfig) -> tuple[tuple[UpsName, float], ...]:
        """Which UPSes carry a resource's watts, and what part each carries: its own feeds,
        or those of the hosts it runs on (worked out once per set of hosts)."""
        feeds = self._site.feeds_of(res.id)
        if feeds or not res.runs_on:
            return self._shares_among(feeds)
        hosts = tuple(res.runs_on)
        if hosts not in self._by_hosts:
            host_feeds = [f for host in hosts for f in self._site.feeds_of(host)]
            self._by_hosts[hosts] = self._shares_among(host_feeds)
        return self._by_hosts[hosts]

    def _shares_among(self, feeds: list[FeedConfig]) -> tuple[tuple[UpsName, float], ...]:
        """Equal parts for the UPSes of ``feeds``; every UPS when no feed says."""
        return _equal_shares(tuple(u for f in feeds for u in f.ups) or self._all_ups)

    def _add_load(self, rid: ResourceId, watts: float) -> None:
        self._changes += 1
        for ups, share in self._shares.get(rid, ()):
            self.load[ups] = max(0.0, self.load[ups] + watts * share)

    # -- what the simulated plugins call ----------------------------------------------------

    def power_changed(self, rid: ResourceId, fraction: float, state: PowerState) -> None:
        self.advance()
        watts = self._watts[rid] * fraction
        self._add_load(rid, watts if state is PowerState.ON else -watts)

    def set_mains(self, names: Iterable[UpsName] | None, on: bool) -> None:
        self.advance()
        for name in names or list(self.mains):
            self.mains[name] = on

    def advance(self) -> None:
        now = self._clock.monotonic()
        elapsed = now - self._last
        self._last = now
        if elapsed <= 0:
            return
        self._changes += 1
        for name, battery in self.batteries.items():
            if self.mains[name]:
                battery.charge(elapsed)
                continue
            empty_after = battery.drain(self.load[name], elapsed)
            if empty_after is not None and name not in self.depleted_at:
                self.depleted_at[name] = now - elapsed + empty_after

    def runtime_s(self, name: UpsName) -> float:
        return self.batteries[name].runtime_s(self.load[name])

    def reading(self, ups: UpsName) -> UpsReading:
        self.advance()
        battery = self.batteries[ups]
        config = next(u for u in self._site.ups if u.name == ups)
        runtime = self.runtime_s(ups)
        flags = {UpsFlag.OL, UpsFlag.CHRG} if self.mains[ups] else {UpsFlag.OB, UpsFlag.DISCHRG}
        if self.mains[ups] and battery.soc >= 1.0:
            flags.discard(UpsFlag.CHRG)
        low = battery.charge_pct <= config.low_battery_charge or (
            runtime <= config.low_battery_runtime.total_seconds()
        )
        if low and not self.mains[ups]:
            flags.add(UpsFlag.LB)
        if ups in self.depleted_at:
            flags = {UpsFlag.OFF}
        return UpsReading(
            ups=ups,
            at=self._clock.now(),
            flags=frozenset(flags),
            charge_pct=round(battery.charge_pct, 1),
            runtime_s=round(runtime),
            load_pct=None,
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


@functools.lru_cache(maxsize=256)
def _equal_shares(names: tuple[UpsName, ...]) -> tuple[tuple[UpsName, float], ...]:
    """Thousands of VMs share the same few UPS sets: worked out once per set."""
    return tuple((u, 1.0 / len(names)) for u in names)
