"""``schema``, ``validate``, ``plan`` and ``simulate`` as a person at a terminal sees them:
one line and a non-zero exit for a mistake, words rather than Python's data for what is
shown, and nothing on stderr that the timeline already says.

Defects these reproduce (each failed before its fix): ``schema -o`` into a missing folder,
a folder or /proc printed a traceback; a scenario whose outage starts after its horizon
passed quietly with exit 0; ``validate`` said "1 caches"; the plan showed a selector's
attribute as ``{'tier': 'batch'}``; ``simulate`` printed the watch's warnings with
wall-clock times on stderr beside its own timeline.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sites import EXAMPLES, simple_site, site_from, write_site
from upsguard.cli import main


@pytest.mark.parametrize(
    "target", ["missing/folder/site.schema.json", ".", "/proc/site.schema.json"]
)
def test_schema_that_cannot_be_written_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    output = tmp_path / target if not target.startswith("/") else Path(target)

    code = main(["schema", "-o", str(output)])

    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"upsguard: {output}: cannot write the schema")


def test_schema_is_written_where_asked(tmp_path: Path) -> None:
    output = tmp_path / "site.schema.json"
    assert main(["schema", "-o", str(output)]) == 0
    assert output.read_text(encoding="utf-8").startswith("{")


def scenario_file(tmp_path: Path, text: str) -> Path:
    return write_site(tmp_path, text, "scenario.yaml")


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [
        ("outage: {at: 25h}\n", "outage.at", 1),
        ("horizon: 2h\npower:\n  - {at: 3h, state: battery}\n", "power[0].at", 3),
        ("horizon: 2h\nflapping:\n  - {start: 2h, stop: 3h}\n", "flapping[0].start", 3),
        ("horizon: 1h\noutage: {at: 1m}\nups: {ups1: {fails_at: 2h}}\n", "ups.ups1.fails_at", 3),
    ],
)
def test_a_change_after_the_horizon_is_a_scenario_mistake_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str, line: int
) -> None:
    site = write_site(tmp_path, yaml.safe_dump(simple_site(), sort_keys=False))  # UPS ups1
    scenario = scenario_file(tmp_path, text)

    code = main(["simulate", "-c", str(site), "--scenario", str(scenario)])

    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith(f"upsguard: {field}: ")
    assert "after the horizon" in err
    assert err.rstrip().endswith(f"({scenario}:{line})")
    assert err.count("\n") == 1


def test_validate_counts_in_words_that_agree_with_their_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = simple_site()
    data["caches"] = [{"name": "c1", "provider": "simulated", "carries": ["db"]}]
    site = site_from(tmp_path, data)
    path = tmp_path / "site.yaml"
    assert site.caches and path.exists()

    assert main(["validate", "-c", str(path)]) == 0

    out = capsys.readouterr().out
    assert "1 cache," in out and "1 caches" not in out
    assert "7 resources" in out and "1 UPS" in out


def test_a_selector_reads_as_words_in_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "shutdown", "-c", str(EXAMPLES / "cluster.yaml")]) == 0
    out = capsys.readouterr().out
    assert "{" not in out and "'" not in out.replace("with 'shutdown'", "")  # its program
    assert "4 VMs of group batch (attribute tier=batch)" in out
    assert "8 VMs of group web (name web-*, folder Prod/Web)" in out


def test_simulate_says_what_happened_on_its_timeline_only() -> None:
    scenario = EXAMPLES / "scenarios" / "lost-contact.yaml"
    argv = ["simulate", "-c", str(EXAMPLES / "homelab.yaml"), "--scenario", str(scenario)]

    done = subprocess.run(
        [sys.executable, "-m", "upsguard", *argv], capture_output=True, text=True, check=False
    )

    assert done.returncode == 0
    assert done.stderr == ""  # no wall-clock log lines beside the virtual clock's timeline
    assert "WARNING: UPS cp1500 cannot be read" in done.stdout


def test_the_proxmox_ceph_example_validates_plans_both_ways_and_simulates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    site = str(EXAMPLES / "proxmox-ceph.yaml")
    assert main(["validate", "-c", site]) == 0
    assert "ok: site 'pve-ceph'" in capsys.readouterr().out
    assert main(["plan", "shutdown", "-c", site]) == 0
    shutdown = capsys.readouterr().out
    marks = ["stop:pve-ha ", "stop:web ", "stop:pve-ceph ", "stop:pve1 ", "loses its quorum"]
    at = [shutdown.index(m) for m in marks]
    assert at == sorted(at), shutdown
    assert main(["plan", "startup", "-c", site]) == 0
    startup = capsys.readouterr().out
    marks = ["start:pve2 ", "start:pve1 ", "start:pve-ceph ", "start:dns01 ", "start:pve-ha "]
    at = [startup.index(m) for m in marks]
    assert at == sorted(at), startup
    assert main(["simulate", "-c", site]) == 0
    assert "\nOK: shutdown finishes" in capsys.readouterr().out
