"""The phase policy end to end on the simulator's virtual clock (same loop as the service).

Battery figures come from the simulator's Peukert model; every scenario here
is one a site can replay with ``upsguard simulate --scenario``.
"""

from __future__ import annotations

from upsguard.config.loading import validate
from upsguard.config.scenario import parse_scenario
from upsguard.config.site import SiteConfig
from upsguard.config.source import parse_yaml
from upsguard.models import UpsName
from upsguard.simulation.simulator import Moment, SimulationReport, simulate

UPS1 = UpsName("ups1")

SITE = """
site: lab
journal: /tmp/unused.sqlite
ups:
  - {name: ups1, simulated: {}, runtime_at: {minutes: 20, load_watts: 600}, other_load_watts: 20}
platforms:
  sim: {type: simulated, guest_shutdown: 30s, host_shutdown: 90s, power_on: 30s,
        host_power_on: 2m, device_shutdown: 40s}
caches:
  - {name: flash, provider: simulated, carries: [db], dirty: 6GiB, destage_rate: 100MiB/s,
     worst_case_rate: 100MiB/s}
resources:
  - {id: web, kind: vm, platform: sim, runs_on: [esx1], watts: 60, depends_on: [db]}
  - {id: db, kind: vm, platform: sim, runs_on: [esx1], watts: 80}
  - {id: esx1, kind: host, platform: sim, watts: 200, depends_on: [nas]}
  - {id: nas, kind: storage, platform: sim, watts: 120}
policies:
  poll_interval: 5s
  on_battery: {after: 10s}
  shutdown: {when_any: [low_battery, fsd, "runtime < plan + 4m"]}
  power_returns: {before_point_of_no_return: cancel, online_for: 30s}
  startup: {online_for: 5m, charge_above: 50}
  required_margin: 2m
"""


def site() -> SiteConfig:
    return validate(SiteConfig, parse_yaml(SITE, "site.yaml"))


def run(scenario: str) -> SimulationReport:
    s = site()
    return simulate(s, parse_scenario(scenario, s, "scenario.yaml"))


def lines(report: SimulationReport, kind: str | None = None) -> list[Moment]:
    return [m for m in report.timeline if kind is None or m.kind == kind]


def texts(report: SimulationReport, kind: str) -> list[str]:
    return [m.text for m in lines(report, kind)]


def test_a_second_outage_on_a_half_empty_battery_still_ends_in_a_clean_shutdown() -> None:
    report = run(
        """
        outage: {at: 1m}
        power:
          - {at: 25m, state: online}     # back after the first shutdown
          - {at: 48m, state: battery}    # again right after the startup: battery half full
        recharge: 1h
        horizon: 3h
        """
    )
    assert texts(report, "RunFinished") == [
        "shutdown runbook done: 4 done",
        "startup runbook done: 4 done",
        "shutdown runbook done: 4 done",
    ]
    assert report.ran_out_at_s is None
    assert report.final_phase == "down"
    startup = lines(report, "RunStarted")[1]
    assert startup.text.startswith("startup") and startup.battery[UPS1][0] >= 49.9
    first, second = [m for m in lines(report, "RunStarted") if m.text.startswith("shutdown")]
    assert second.at_s - 48 * 60 < (first.at_s - 60) / 2  # a fuller site file would start sooner
    done = [m for m in lines(report, "RunFinished") if m.text.startswith("shutdown")]
    assert done[1].battery[UPS1][0] > site().policies.critical_floor.charge_below


def test_flapping_mains_start_no_runbook_and_flip_no_cache() -> None:
    report = run(
        """
        flapping: [{start: 1m, stop: 6m, every: 3s}]
        horizon: 30m
        """
    )
    assert texts(report, "RunStarted") == []
    # polled every 5 s, a 3 s flap can look like 10 s on battery: the caches may go
    # write-through once, and come back once power has been stable; never back and forth
    assert texts(report, "CacheModeChanged") in (
        [],
        ["cache flash/flash -> write-through", "cache flash/flash -> write-back"],
    )
    modes = lines(report, "CacheModeChanged")
    if modes:
        assert modes[1].at_s >= 6 * 60 + 30  # write-back only after 30 s of stable mains
    assert report.final_phase == "normal"


def test_power_back_before_the_point_of_no_return_cancels_and_restarts_in_order() -> None:
    report = run(
        """
        outage: {at: 1m, duration: 7m}    # the shutdown starts at 7m40s, power is back at 8m
        ups: {ups1: {start_charge: 50}}
        recharge: 30m
        horizon: 2h
        """
    )
    phases = texts(report, "PhaseChanged")
    assert "phase shutting_down -> recovering: power back before the point of no return" in phases
    assert texts(report, "PointOfNoReturn") == []
    cancelled = [t for t in texts(report, "RunFinished") if "cancelled" in t]
    assert cancelled, report.timeline
    waits = texts(report, "StepWaiting")
    assert any(
        w.startswith("  waiting  start:db: letting the shutdown asked by run") for w in waits
    )
    started = [t.split()[1] for t in texts(report, "StepStarted") if "start:" in t]
    assert started.index("start:db") < started.index("start:web")
    # db's guest shutdown was under way when the run was cancelled: it is started again
    assert "  done      start:db: db up" in texts(report, "StepFinished")
    assert report.final_phase == "normal"
    modes = texts(report, "CacheModeChanged")
    assert modes[0].endswith("write-through") and modes[-1].endswith("write-back")


def test_power_back_after_the_point_of_no_return_finishes_then_starts_up() -> None:
    report = run(
        """
        outage: {at: 1m, duration: 8m}    # back at 9m, after the PONR at 8m40s
        ups: {ups1: {start_charge: 50}}
        recharge: 30m
        horizon: 3h
        """
    )
    assert texts(report, "PointOfNoReturn")
    runs = texts(report, "RunFinished")
    assert runs[0] == "shutdown runbook done: 4 done", report.timeline
    assert runs[1] == "startup runbook done: 4 done"
    phases = texts(report, "PhaseChanged")
    assert phases[-3:] == [
        "phase shutting_down -> down: shutdown runbook finished",
        "phase down -> recovering: power back",
        "phase recovering -> normal: recovered",
    ]
