"""A feed at risk stops only what it powers, plus what needs that; everything else stays up.

On the cluster example with a backup box added on ups-a alone (every host, and the
management box running upsguard, on two UPSes): ups-a failing while ups-b holds puts only
the feed ``backup-a`` at risk.
"""

from __future__ import annotations

from pathlib import Path

from upsguard.config import SiteConfig, load_site
from upsguard.config.scenario import parse_scenario
from upsguard.models import ResourceId
from upsguard.runbooks.planner import Planner
from upsguard.simulation.simulator import SimulationReport, simulate

CLUSTER = Path(__file__).resolve().parents[2] / "config" / "examples" / "cluster.yaml"
BACKUP = """
  - {name: backup-a, ups: [ups-a], powers: [backup01]}
"""
BACKUP_HOST = """
  - {id: backup01, kind: storage, platform: storage-ssh, host: backup01.hq.example,
     shutdown: poweroff, watts: 60, power_on_via: bmc-nas01}
"""


def cluster_with_a_backup_box(tmp_path: Path) -> SiteConfig:
    """The cluster example, and a backup box on ups-a alone."""
    text = CLUSTER.read_text()
    text = text.replace("\nplatforms:", BACKUP + "\nplatforms:", 1)
    text = text.replace("\npolicies:", BACKUP_HOST + "\npolicies:", 1)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_site(path)


def stopped(report: SimulationReport) -> list[str]:
    return [
        m.text.split()[1].rstrip(":")
        for m in report.timeline
        if m.text.strip().startswith("done") and "stop:" in m.text
    ]


def test_one_ups_failing_stops_only_what_its_feed_powers(tmp_path: Path) -> None:
    site = cluster_with_a_backup_box(tmp_path)
    scenario = parse_scenario(
        "name: ups-a fails\noutage: {at: 30s, ups: [ups-a]}\nhorizon: 3h\n", site, "s.yaml"
    )
    report = simulate(site, scenario)
    assert stopped(report) == ["stop:backup01"], [m.text for m in report.timeline]
    texts = "\n".join(m.text for m in report.timeline)
    assert "esx-flash" not in texts  # its data path (the hosts) never lost power


def test_both_ups_failing_still_stops_the_whole_site() -> None:
    site = load_site(CLUSTER)
    scenario = parse_scenario("name: all fail\noutage: {at: 30s}\nhorizon: 3h\n", site, "s.yaml")
    report = simulate(site, scenario)
    assert set(stopped(report)) == {s.id for s in Planner(site).plan("shutdown").steps}


def test_stopping_the_controllers_own_machine_alone_stops_nothing_else() -> None:
    """Being put last is an order, not a need: nothing needs the management box."""
    site = load_site(CLUSTER)
    plan = Planner(site).plan("shutdown", {ResourceId("mgmt01")})
    assert [s.id for s in plan.steps] == ["stop:mgmt01"]
