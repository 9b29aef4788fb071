"""``upsguard demo``: a whole outage and recovery on built-in simulated gear, sped up.

The same outage loop, phase engine, executor, destage watch and journal as
the service, on a virtual clock that runs ``speed`` times faster than the
wall clock (``ScaledTimeLoop``), so a person can watch it unfold: mains fail,
caches flip and drain, the web tier is shed, VMs go down in order, the hosts wait
for the cache to drain (its dirty data, rate and ETA as it goes), mains return, the
battery recharges, everything comes back up and caches return to write-back.
Nothing beyond the package is needed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from upsguard.clock import VirtualTimeLoop
from upsguard.config.loading import validate
from upsguard.config.scenario import parse_scenario
from upsguard.config.site import SiteConfig
from upsguard.config.source import parse_yaml
from upsguard.events import Event, PhaseChanged
from upsguard.simulation.report import moment_line, report_text
from upsguard.simulation.simulator import EventObserver, Moment, Simulation, SimulationReport

DEMO_SITE = """
site: demo
ups:
  - name: ups1
    simulated: {}
    runtime_at: {minutes: 30, load_watts: 900}
    other_load_watts: 60
platforms:
  vcenter:
    type: simulated
    guest_shutdown: 40s
    host_shutdown: 2m
    device_shutdown: 45s
    power_on: 30s
    host_power_on: 2m
caches:
  - {name: esx01-flash, provider: simulated, carries: [sql01, app], dirty: 6GiB,
     destage_rate: 25MiB/s, worst_case_rate: 20MiB/s, destage_timeout: 10m}
resources:
  - {id: dc01, kind: vm, platform: vcenter, runs_on: [esx01], watts: 40}
  - {id: sql01, kind: vm, platform: vcenter, runs_on: [esx01], watts: 90, depends_on: [dc01]}
  - {id: app, kind: vm_group, platform: vcenter, select: {name: "app-*"}, count: 4,
     runs_on: [esx02], watts: 160, depends_on: [sql01]}
  - {id: web, kind: vm, platform: vcenter, runs_on: [esx02], watts: 50, depends_on: [app],
     shed: true}
  - {id: esx01, kind: host, platform: vcenter, watts: 180, depends_on: [nas01]}
  - {id: esx02, kind: host, platform: vcenter, watts: 180, depends_on: [nas01]}
  - {id: nas01, kind: storage, platform: vcenter, watts: 90, estimate: {stop: 45s, start: 1m}}
  - {id: core-sw, kind: switch, watts: 30}
feeds:
  - {ups: [ups1], powers: [dc01, sql01, app, web, esx01, esx02, nas01, core-sw]}
policies:
  poll_interval: 5s
  on_battery: {after: 10s}
  shedding: {when_any: ["on_battery_for > 1m"]}
  shutdown: {when_any: [low_battery, fsd, "runtime < plan + 3m", "on_battery_for > 2m"]}
  power_returns: {before_point_of_no_return: cancel, online_for: 30s}
  startup: {online_for: 3m, charge_above: 20}
  required_margin: 2m
"""

DEMO_SCENARIO = """
name: the demo outage
description: mains fail at T+30s and return 16 minutes later
outage: {at: 30s, duration: 16m}
recharge: 1h
horizon: 2h
"""


class ScaledTimeLoop(VirtualTimeLoop):
    """Virtual time that a person can follow: each jump of N seconds waits N / speed."""

    def __init__(self, speed: float) -> None:
        super().__init__()
        self.speed = speed

    def advance(self, seconds: float) -> None:
        if seconds > 0 and self.speed > 0:
            time.sleep(min(seconds / self.speed, 2.0))
        super().advance(seconds)


def demo_site() -> SiteConfig:
    return validate(SiteConfig, parse_yaml(DEMO_SITE, "demo-site.yaml"))


def run_demo(
    speed: float = 60.0, out: TextIO = sys.stdout, observers: Sequence[EventObserver] = ()
) -> SimulationReport:
    """Play the demo outage, printing each moment as it happens; ``observers`` hear every
    event (the CLI journals them)."""
    site = demo_site()
    scenario = parse_scenario(DEMO_SCENARIO, site, "demo-scenario.yaml")
    pace = f"{speed:g}x speed (a minute takes {60 / speed:.1f} s)" if speed > 0 else "no pause"
    out.write(f"upsguard demo: {scenario.description}; {pace}\n")

    def phase_header(event: Event) -> None:
        if isinstance(event, PhaseChanged):
            out.write(f"\n== {event.new.value.upper()} ==\n")

    def print_moment(moment: Moment) -> None:
        out.write(moment_line(moment) + "\n")
        out.flush()

    sim = Simulation(site, scenario, observers=[*observers, phase_header], on_moment=print_moment)
    with asyncio.Runner(loop_factory=lambda: ScaledTimeLoop(speed)) as runner:
        report: SimulationReport = runner.run(sim.run())
    out.write("\n" + report_text(report).splitlines()[-1] + "\n")
    return report
