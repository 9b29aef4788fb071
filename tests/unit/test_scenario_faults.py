"""What scenarios can make go wrong beside the mains, and what the dry run shows of it: lost
contact and stale data (on line: an alert; on battery: the countdown goes on), a self-test,
FSD from a NUT primary, a UPS that overstates its runtime, one UPS failing while others
hold, a platform that hangs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sites import simple_site, site_from, write_site
from upsguard.config import SiteConfig
from upsguard.config.scenario import load_scenario, parse_scenario
from upsguard.errors import ConfigError
from upsguard.models import UpsName
from upsguard.simulation.simulator import SimulationReport, simulate

UPS1 = UpsName("ups1")


def run(site: SiteConfig, scenario: str) -> SimulationReport:
    return simulate(site, parse_scenario(scenario, site))


def texts(report: SimulationReport) -> list[str]:
    return [m.text for m in report.timeline]


def first(report: SimulationReport, fragment: str) -> float:
    return next(m.at_s for m in report.timeline if fragment in m.text)


def has(report: SimulationReport, fragment: str) -> bool:
    return any(fragment in m.text for m in report.timeline)


# -- contact with a UPS ---------------------------------------------------------------------


@pytest.mark.parametrize("state", ["lost", "stale"])
def test_contact_lost_on_line_is_an_alert_not_an_outage(tmp_path: Path, state: str) -> None:
    site = site_from(tmp_path, simple_site())
    report = run(site, f"contact: [{{at: 2m, duration: 5m, state: {state}}}]\nhorizon: 1h")
    assert has(report, f"scenario: every UPS {'stops answering' if state == 'lost' else 'answers'}")
    assert not any("phase " in t for t in texts(report))
    assert not has(report, "runbook")
    assert report.ok and report.verdict == "the site never ran on battery"
    assert first(report, "WARNING: UPS ups1 cannot be read") >= 120
    assert first(report, "UPS ups1 answers again") >= 420


def test_stale_data_is_a_warning_as_lost_contact_is(tmp_path: Path) -> None:
    """upsd answering DATA-STALE said nothing at all, while a UPS that stopped answering was
    a warning: both are a UPS upsguard cannot read, told once, and once when it is back."""
    site = site_from(tmp_path, simple_site())
    report = run(site, "contact: [{at: 2m, duration: 5m, state: stale}]\nhorizon: 1h")
    warnings = [m for m in report.timeline if m.text.startswith("WARNING: UPS ups1")]
    assert [(m.at_s, m.text) for m in warnings] == [
        (120, "WARNING: UPS ups1 cannot be read: its data is stale")
    ]
    assert [m.at_s for m in report.timeline if m.text == "UPS ups1 answers again"] == [420]


@pytest.mark.parametrize("state", ["lost", "stale"])
def test_contact_lost_on_battery_counts_down_and_shuts_down(tmp_path: Path, state: str) -> None:
    """The link goes at T+5m and never comes back: the last known runtime counts down, and
    the shutdown starts about when it would have with the UPS in sight."""
    site = site_from(tmp_path, simple_site())
    seen = run(site, "outage: {at: 1m}")
    blind = run(site, f"outage: {{at: 1m}}\ncontact: [{{at: 5m, state: {state}}}]")
    assert blind.ok, blind.verdict
    started = first(blind, "shutdown runbook started")
    assert started > 5 * 60
    assert abs(started - first(seen, "shutdown runbook started")) <= 60
    assert not has(blind, "phase on_battery -> recovering")
    assert blind.margin_s is not None and blind.margin_s >= blind.required_margin_s


# -- self-test and FSD ----------------------------------------------------------------------


def test_a_self_test_is_ignored_and_costs_some_charge(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    report = run(site, "self_test: [{at: 2m, duration: 30s}]\nhorizon: 30m")
    assert has(report, "UPS ups1 self-test: on battery 30s, ignored")
    assert not any("phase " in t for t in texts(report))
    charge_after = next(m.battery[UPS1][0] for m in report.timeline if "ends its" in m.text)
    assert charge_after < 100


def test_fsd_from_a_nut_primary_on_battery_shuts_down_at_once(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site(on_battery={"after": "1m"}))
    report = run(site, "outage: {at: 1m}\nfsd: [{at: 90s}]")
    assert first(report, "phase normal -> on_battery") < 60 + 60  # FSD skips the debounce
    assert first(report, "shutting_down: fsd") == pytest.approx(90, abs=5)
    assert report.ok, report.verdict


def test_fsd_on_line_is_not_an_outage(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    report = run(site, "fsd: [{at: 1m, duration: 1m}]\nhorizon: 30m")
    assert has(report, "scenario: every UPS shows FSD")
    assert not has(report, "runbook")


# -- a UPS that lies about its runtime ------------------------------------------------------


def test_an_overstated_runtime_is_caught_by_the_observed_drain(tmp_path: Path) -> None:
    """A cooling loss: the battery holds 40 % of its rating, and the UPS still reports the
    runtime of a healthy one. The drain upsguard measures itself starts the shutdown in
    time; trusting the UPS alone would have run out."""
    data = simple_site()
    data["ups"][0]["runtime_at"] = {"minutes": 60, "load_watts": 400}
    site = site_from(tmp_path, data)
    hot = "outage: {at: 1m}\nups: {ups1: {battery_health: 0.4, overstates_runtime: 2.5}}"
    report = run(site, hot)
    assert report.ok, report.verdict
    assert report.ran_out_at_s is None
    started = first(report, "shutdown runbook started")
    reported = next(m for m in report.timeline if m.at_s == started).battery[UPS1][1] * 2.5
    assert reported > report.plan_estimate_s + 300  # the UPS's own figure said wait


# -- one UPS failing while others hold ------------------------------------------------------


def two_ups_site(tmp_path: Path) -> SiteConfig:
    """Two hosts on two UPSes through dual power supplies; a management box on ups-a only."""
    data = simple_site(shutdown={"when_any": ["low_battery", "runtime < plan + 5m"]})
    ups = {"simulated": {}, "runtime_at": {"minutes": 20, "load_watts": 400}}
    data["ups"] = [{"name": "ups-a", **ups}, {"name": "ups-b", **ups}]
    data["resources"].append({"id": "mgmt", "kind": "host", "platform": "dev", "watts": 20})
    data["feeds"] = [
        {
            "name": "dual",
            "ups": ["ups-a", "ups-b"],
            "min_supplies": 1,
            "powers": ["h1", "h2", "nas", "sw"],
        },
        {"name": "single", "ups": ["ups-a"], "powers": ["mgmt"]},
    ]
    return site_from(tmp_path, data)


def test_one_ups_on_battery_shuts_down_only_the_feed_at_risk(tmp_path: Path) -> None:
    site = two_ups_site(tmp_path)
    report = run(site, "outage: {at: 1m, ups: [ups-a]}\nhorizon: 3h")
    assert has(report, "feed single on battery")
    assert not has(report, "feed dual on battery")
    lines = [t for t in texts(report) if t.startswith("  start stop:")]
    assert lines == ["  start stop:mgmt (device_shutdown)"] or lines == [
        "  start stop:mgmt (host_shutdown)"
    ]
    # ups-a runs empty later: the dual feed goes on, on ups-b alone
    assert report.ok, report.verdict
    assert report.ran_out_at_s is None


def test_a_feed_that_loses_its_redundancy_says_so(tmp_path: Path) -> None:
    """One UPS of two on battery for half an hour said nothing, while it drained to 11.6 %:
    the feed still had its min_supplies, but one more failure would take it down."""
    site = two_ups_site(tmp_path)
    report = run(site, "outage: {at: 1m, duration: 10m, ups: [ups-a]}\nhorizon: 3h")
    said = [(m.at_s, m.text) for m in report.timeline if "redundan" in m.text]
    assert said == [
        (
            60,
            "WARNING: feed dual has lost its redundancy: ups-a on-battery, ups-b online "
            "(1 of 2 UPSes on mains, 1 needed)",
        ),
        (660, "feed dual is redundant again: ups-a online, ups-b online"),
    ]
    assert not has(report, "feed single has lost")  # one UPS: no redundancy to lose


def test_a_failed_ups_takes_down_what_only_it_feeds(tmp_path: Path) -> None:
    site = two_ups_site(tmp_path)
    report = run(site, "ups: {ups-a: {fails_at: 2m}}\nhorizon: 1h")
    assert has(report, "scenario: UPS ups-a fails")
    assert has(report, "UPS ups-a cannot be read")
    assert not report.ok
    assert report.lost_power == ["mgmt"]  # the hosts hold on ups-b
    assert report.verdict.startswith("UPS ups-a failed at T+2m, during stop:mgmt: mgmt lost")


def test_a_failed_ups_after_its_feed_is_down_loses_nothing(tmp_path: Path) -> None:
    site = two_ups_site(tmp_path)
    report = run(site, "outage: {at: 1m, ups: [ups-a]}\nups: {ups-a: {fails_at: 36m}}\nhorizon: 2h")
    assert first(report, "shutdown runbook done") < 36 * 60
    assert report.ok, report.verdict


# -- a platform that hangs ------------------------------------------------------------------


def test_a_platform_that_hangs_for_a_while_delays_its_steps(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site(shutdown={"when_any": ["on_battery_for > 1m"]}))
    calm = run(site, "outage: {at: 1m}")
    hung = run(site, "outage: {at: 1m}\nplatforms: {vc: {hang: {at: 2m, duration: 90s}}}")
    assert has(hung, "scenario: vc hangs") and has(hung, "scenario: vc answers again")
    assert not hung.failed_steps
    assert first(calm, "start stop:web") == first(hung, "start stop:web") < 120 + 90
    assert first(hung, "done      stop:web") == 120 + 90 + 40  # from the hang's end on


def test_a_platform_that_never_answers_fails_its_steps(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site(shutdown={"when_any": ["on_battery_for > 1m"]}))
    report = run(site, "outage: {at: 1m}\nplatforms: {vc: {hang: {at: 0s}}}")
    assert not report.ok
    assert any(f.startswith("stop:web:") and "no answer" in f for f in report.failed_steps)
    assert has(report, "done      stop:nas")  # the other platform goes on


# -- scenario files -------------------------------------------------------------------------


def test_a_scenario_for_another_site_says_so_in_one_line(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    path = write_site(tmp_path, "site: hq\nsteps: {sql01: {hang: true}}\n", "sc.yaml")
    with pytest.raises(ConfigError) as info:
        load_scenario(path, site)
    assert info.value.problems == [
        f"site: this scenario is for site 'hq', not 'test': simulate it with that site's file "
        f"({path}:1)"
    ]


def test_new_sections_name_unknown_upses_and_platforms(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    text = "contact: [{at: 1m, ups: [ups2]}]\nplatforms: {vcc: {hang: {at: 1m}}}\n"
    path = write_site(tmp_path, text, "sc.yaml")
    with pytest.raises(ConfigError) as info:
        load_scenario(path, site)
    assert info.value.problems == [
        f"contact[0].ups[0]: unknown UPS 'ups2' (did you mean 'ups1'?) ({path}:1)",
        f"platforms.vcc: unknown platform 'vcc' (did you mean 'vc'?) ({path}:2)",
    ]
