"""Every example scenario names the site it was written for and runs against it: the verdict
it describes, and nothing a site file does not know."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sites import EXAMPLES
from upsguard.config import SiteConfig, load_site
from upsguard.config.scenario import load_scenario
from upsguard.simulation.simulator import simulate

SCENARIOS = sorted((EXAMPLES / "scenarios").glob("*.yaml"))
NOT_OK = {"aged-battery.yaml"}
"""Examples whose point is a NOT OK verdict (each says so in its description)."""


def site_files() -> dict[str, Path]:
    """Each example site file by the name in its ``site:``."""
    return {yaml.safe_load(p.read_text())["site"]: p for p in sorted(EXAMPLES.glob("*.yaml"))}


def site_of(scenario: Path) -> Path:
    name = yaml.safe_load(scenario.read_text()).get("site")
    assert name, f"{scenario.name} names no site"
    sites = site_files()
    assert name in sites, f"{scenario.name}: no example site named {name!r}"
    path = sites[name]
    assert f"config/examples/{path.name}" in scenario.read_text().splitlines()[0]
    return path


def test_there_is_an_example_for_each_thing_a_scenario_can_make_go_wrong() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {
        "lost-contact",
        "stale-data",
        "self-test",
        "fsd",
        "cooling-loss",
        "one-ups-fails",
        "hung-platform",
    } <= names


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_example_scenario_runs_against_its_site(scenario: Path) -> None:
    site: SiteConfig = load_site(site_of(scenario))
    report = simulate(site, load_scenario(scenario, site))
    if scenario.name in NOT_OK:
        assert not report.ok, report.verdict
        assert "NOT OK" in yaml.safe_load(scenario.read_text())["description"]
    else:
        assert report.ok, f"{scenario.name}: {report.verdict}"
    assert report.ran_out_at_s is None


def simulate_cli(site: Path, scenario: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "upsguard", "simulate", "-c", str(site), "--scenario", scenario],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(("name", "code"), [("one-ups-fails.yaml", 0), ("aged-battery.yaml", 1)])
def test_cli_simulate_example_exit_codes(name: str, code: int) -> None:
    scenario = EXAMPLES / "scenarios" / name
    done = simulate_cli(site_of(scenario), scenario)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr
    verdict = "OK: " if code == 0 else "NOT OK: "
    assert done.stdout.strip().splitlines()[-1].startswith(verdict)


def test_cli_simulate_against_the_wrong_site_says_which_in_one_line() -> None:
    scenario = EXAMPLES / "scenarios" / "long-outage.yaml"
    done = simulate_cli(EXAMPLES / "homelab.yaml", scenario)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"upsguard: site: this scenario is for site 'hq', not 'homelab': simulate it with that "
        f"site's file ({scenario}:2)"
    ]


def test_one_ups_failing_is_told_while_the_other_holds() -> None:
    """The example said nothing between T+1m and T+30m while ups-a drained to 11.6 %."""
    scenario = EXAMPLES / "scenarios" / "one-ups-fails.yaml"
    site = load_site(site_of(scenario))
    report = simulate(site, load_scenario(scenario, site))
    warned = [m for m in report.timeline if m.text.startswith("WARNING: feed ")]
    assert [(m.at_s, m.text.split(":")[1]) for m in warned] == [
        (60, " feed dual-psu has lost its redundancy"),
        (60, " feed mgmt has lost its redundancy"),
    ]
