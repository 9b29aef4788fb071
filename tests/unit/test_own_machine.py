"""upsguard's own machine: it goes down last, only once something will bring it back, and
never on a weaker feed than what it guards without a warning.

Defects these reproduce (each failed before its fix):
- the homelab with the mains back past the point of no return: the controller powered its
  own machine off with the mains on and no UPS command, and the site stayed down for good
  (the simulator then showed a startup that could not happen);
- the cluster example with the management box on ups-a alone: in 'one-ups-fails' the
  controller powered itself off while the hosts ran on, unguarded, and validate, the verdict
  and the service said nothing;
- a pair's standby that could not read the UPS (its path to upsd cut while the mains were
  on) took the run back at the controllers' machines and read the UPS out of contact as the
  mains there: both machines stayed up "to start the site again" and no UPS was told its
  load cycle, while the leader read the UPS on battery (a full lane beside two busy loops,
  ``test_ha_pair``'s controllers that disagree about the UPS).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.sites import EXAMPLES
from upsguard.cli import main
from upsguard.clock import SystemClock
from upsguard.config import SiteConfig, load_site
from upsguard.config.checks import site_warnings
from upsguard.config.scenario import load_scenario, parse_scenario
from upsguard.config.site import feed_name
from upsguard.engine.end_of_outage import EndOfOutage
from upsguard.models import LinkState, ResourceId, RunId, UpsFlag, UpsName, UpsReading
from upsguard.policies.phases import PowerView
from upsguard.policies.power import UpsFigures, read_feed
from upsguard.runs import RunKind, RunOrigin, RunSpec
from upsguard.simulation.simulator import SimulationReport, simulate
from upsguard.units import format_duration

HOMELAB = EXAMPLES / "homelab.yaml"
CLUSTER = EXAMPLES / "cluster.yaml"
WEAK_MGMT = """  - {name: mgmt-a, ups: [ups-a], powers: [mgmt01]}"""


def weak_cluster(tmp_path: Path) -> Path:
    """The cluster example as it was: the management box on ups-a alone."""
    text = CLUSTER.read_text()
    start = text.index("  - {name: mgmt,")
    end = text.index("\n", start)
    path = tmp_path / "cluster.yaml"
    path.write_text(text[:start] + WEAK_MGMT + text[end:])
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def lines(report: SimulationReport) -> list[str]:
    return [m.text for m in report.timeline]


def simulate_text(site: SiteConfig, scenario: str) -> SimulationReport:
    return simulate(site, parse_scenario(scenario, site, "scenario.yaml"))


def test_mains_back_past_the_point_of_no_return_upsguard_stays_up_and_starts_the_site() -> None:
    site = load_site(HOMELAB)
    report = simulate_text(site, "name: back after ponr\noutage: {at: 1m, duration: 12m}\n")
    said = lines(report)
    assert any(t.startswith("point of no return") for t in said)
    own = [t for t in said if "stop:mgmt" in t]
    assert own == [
        "  skipped   stop:mgmt: the mains are there: upsguard stays up on mgmt to start the "
        "site again"
    ]
    assert "upsguard's machine mgmt is off: nothing acts until it boots" not in said
    assert report.ok and report.back_at_s is not None
    assert report.verdict.endswith(f"the site is back at T+{format_duration(report.back_at_s)}")


def test_on_battery_upsguard_stops_last_after_the_load_cycle_and_boots_with_the_power() -> None:
    site = load_site(HOMELAB)
    report = simulate_text(site, "name: long\noutage: {at: 1m, duration: 40m}\nhorizon: 4h\n")
    said = lines(report)
    cycle = said.index("UPS cp1500: sent shutdown.return")
    assert said[cycle + 1] == "  start stop:mgmt (host_shutdown)"
    off = said.index("upsguard's machine mgmt is off: nothing acts until it boots")
    back = said.index("upsguard's machine mgmt boots: the controller takes up again")
    between = said[off + 1 : back]
    assert not [t for t in between if t.strip().startswith(("start ", "phase"))], between
    assert report.ok and report.back_at_s is not None and report.back_at_s > 41 * 60


def test_without_a_load_cycle_upsguard_stays_up_while_the_battery_lasts(tmp_path: Path) -> None:
    text = HOMELAB.read_text().replace("command: shutdown.return", "command: load.off.delay")
    path = tmp_path / "homelab.yaml"
    path.write_text(text)
    site = load_site(path)
    report = simulate_text(site, "name: long\noutage: {at: 1m, duration: 40m}\nhorizon: 4h\n")
    own = [t for t in lines(report) if "stop:mgmt" in t]
    assert own == [
        "  skipped   stop:mgmt: nothing would bring power back to mgmt (no load cycle from "
        "UPS cp1500): upsguard stays up while the battery lasts"
    ]
    assert report.back_at_s is not None  # it saw the mains return and started the site


def test_validate_warns_of_the_controller_on_a_weaker_feed_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "-c", str(weak_cluster(tmp_path))]) == 0
    err = capsys.readouterr().err
    weak = [line for line in err.splitlines() if "weaker than feed" in line]
    assert weak == [
        "upsguard: warning: resources[13]: mgmt01, the machine running upsguard, hangs on feed "
        "mgmt-a, weaker than feed dual-psu (ups-a, ups-b; 1 needed): when ups-a fails, "
        "upsguard goes down while dual-psu still powers esx01, esx02, esx03, nas01, and "
        "nothing guards them; power mgmt01 from dual-psu's UPSes too (its 'powers' list) "
        f"({tmp_path / 'cluster.yaml'}:{line_of(tmp_path / 'cluster.yaml', 'id: mgmt01')})"
    ]


def test_the_cluster_example_keeps_its_controller_on_both_ups() -> None:
    warned = [m for _, m in site_warnings(load_site(CLUSTER)) if "weaker than feed" in m]
    assert warned == []


def test_the_verdict_says_from_when_the_site_is_unguarded_and_the_service_said_it_first(
    tmp_path: Path,
) -> None:
    site = load_site(weak_cluster(tmp_path))
    scenario = load_scenario(EXAMPLES / "scenarios" / "one-ups-fails.yaml", site)
    report = simulate(site, scenario)
    said = lines(report)
    alert = (
        "ERROR: upsguard stops its own machine mgmt01 while esx01, esx02, esx03, nas01 run on: "
        "from now on nothing guards them (see validate's warning on its feed)"
    )
    off = "upsguard's machine mgmt01 is off: nothing acts until it boots"
    assert said.index(alert) < said.index(off)
    assert not report.ok
    since = format_duration(report.unguarded[0].from_s)
    assert report.verdict.endswith(
        f"unguarded from T+{since}: esx01, esx02, esx03, nas01 ran on while upsguard's machine "
        "was off"
    )


def test_a_failed_shutdown_cuts_nothing_not_known_off_until_the_critical_floor() -> None:
    """The NAS refused its shutdown: the UPS's load cycle went out when the other steps were
    done, counting every planned resource as stopped, and cut nas01 under its running
    system with most of the battery left. It waits for the critical floor now, says so,
    and upsguard's machine stays up meanwhile (nothing would bring it back)."""
    site = load_site(HOMELAB)
    report = simulate_text(
        site, "name: nas refuses\noutage: {at: 1m}\nsteps: {nas01: {fail: stop}}\nhorizon: 3h\n"
    )
    said = lines(report)
    failed = next(i for i, t in enumerate(said) if t.startswith("  failed    stop:nas01"))
    withheld = said.index(
        "WARNING: UPS cp1500: shutdown.return not sent: it would cut nas01, not known off; "
        "sent at the critical floor if they are still not"
    )
    sent = said.index("UPS cp1500: sent shutdown.return")
    floor = next(i for i, t in enumerate(said) if "the battery is at the critical floor" in t)
    assert failed < withheld < floor == sent - 1
    assert said[floor] == (
        "ERROR: UPS cp1500: the battery is at the critical floor: shutdown.return sent "
        "although it cuts nas01, not known off (the battery would drop them in moments; the "
        "load cycle brings them back)"
    )
    assert said.count(said[withheld]) == 1
    charge_when_sent = report.timeline[sent].battery[UpsName("cp1500")][0]
    assert charge_when_sent < 10
    own = [t for t in said if "stop:mgmt" in t]
    assert own == [
        "  skipped   stop:mgmt: nothing would bring power back to mgmt (no load cycle from "
        "UPS cp1500): upsguard stays up while the battery lasts"
    ]


def homelab_out_of_contact() -> tuple[SiteConfig, PowerView]:
    """The homelab, its one UPS read out of contact since it was on mains (the feed is
    ``unknown``: not at risk, not on mains either)."""
    site = load_site(HOMELAB)
    (feed,) = site.feeds_powering(ResourceId("mgmt"))
    name = feed_name(feed, site.effective_feeds().index(feed))
    ups = UpsName("cp1500")
    lost = UpsReading(ups, SystemClock().now(), frozenset({UpsFlag.OL}), link=LinkState.LOST)
    reading = read_feed(name, feed, {ups: UpsFigures(lost, None, None)})
    assert (reading.at_risk, reading.state) == (False, "unknown")
    return site, PowerView(at_s=0.0, feeds=(reading,), min_charge_pct=None)


def own_machine(
    site: SiteConfig, view: PowerView, told: dict[UpsName, datetime] | None = None
) -> str | None:
    """What the controller decides at its own machine's step of a shutdown (resumed, when a
    controller before it ``told`` UPSes, and when)."""
    clock = SystemClock()
    end = EndOfOutage(site, {}, clock, lambda event: None)
    spec = RunSpec(RunId("shutdown-1"), RunKind.SHUTDOWN, RunOrigin.MANUAL, "a person", clock.now())
    if told is not None:
        end.told_before(spec.id, told)
    own = next(r for r in site.resources if r.runs_upsguard)
    return asyncio.run(end.own_machine(spec, own, [], view))


def test_a_ups_out_of_contact_since_it_was_on_mains_is_no_sign_of_the_mains() -> None:
    """The controller lost its UPS while the mains were on (an alert, not an outage: the
    feed is not at risk), and a shutdown reached its own machine: that the mains are there
    is not known, so it is not why the machine stays up."""
    site, view = homelab_out_of_contact()

    assert not EndOfOutage(site, {}, SystemClock(), lambda event: None).mains_there(
        ResourceId("mgmt"), view
    )
    assert own_machine(site, view) == (
        "nothing would bring power back to mgmt (no load cycle from UPS cp1500): upsguard "
        "stays up while the battery lasts"
    )


def test_a_load_cycle_told_before_a_restart_and_since_come_and_gone_brings_nothing_back() -> None:
    """A controller before this one told the UPS its load cycle (2 minutes' delay) 10
    minutes ago, then stopped before its own machine's step: the cycle cut the output and
    brought it back, the machine booted, and this controller resumes the run. That cycle is
    spent: stopping the machine now, it would stay off for good."""
    site, view = homelab_out_of_contact()
    told_at = datetime.now(UTC) - timedelta(minutes=10)

    assert own_machine(site, view, {UpsName("cp1500"): told_at}) == (
        "nothing would bring power back to mgmt (the load cycle of UPS cp1500 was due at "
        f"{(told_at + timedelta(minutes=2)).astimezone():%H:%M:%S} and is spent): upsguard "
        "stays up while the battery lasts"
    )


def test_a_load_cycle_told_before_a_restart_and_not_due_yet_lets_the_machine_stop() -> None:
    """The controller before this one told the UPS its load cycle a moment ago (a restart,
    not a reboot): the cut is still ahead, and brings the machine back."""
    site, view = homelab_out_of_contact()

    assert own_machine(site, view, {UpsName("cp1500"): datetime.now(UTC)}) is None
