"""``upsguard trigger`` with no service running runs the plan in its own process.

Defect this reproduces (it failed before the fix): the journal was left lying, its phase at
``shutting_down`` after the shutdown had finished (and ``recovering`` after a finished
startup), and every warning was printed twice (the event's line, then its log record).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sites import write_site
from upsguard.cli import main
from upsguard.journal import Journal

SITE = """
site: offline
journal: {tmp}/journal.sqlite
ups:
  - {{name: u1, simulated: {{}}}}
platforms:
  sim: {{type: simulated, guest_shutdown: 0s, host_shutdown: 0s, power_on: 0s,
        host_power_on: 0s}}
resources:
  - {{id: vm1, kind: vm, platform: sim, runs_on: [h1]}}
  - {{id: h1, kind: host, platform: sim}}
service: {{socket: {tmp}/api.sock}}
"""


def journaled_phase(tmp_path: Path) -> str | None:
    journal = Journal(tmp_path / "journal.sqlite")
    try:
        phase = journal.read.last_phase()
    finally:
        journal.close()
    return phase.value if phase is not None else None


def test_trigger_without_a_service_leaves_the_journal_telling_the_truth_and_says_each_thing_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = write_site(tmp_path, SITE.format(tmp=tmp_path))

    assert main(["trigger", "shutdown", "-c", str(site), "--yes"]) == 0
    out, err = capsys.readouterr()
    assert journaled_phase(tmp_path) == "down"
    said = [line.split("  ", 1)[1] for line in out.splitlines() if "  " in line]
    assert said.count("override: trigger shutdown by " + said[0].split(" by ", 1)[1]) == 1
    assert "override: trigger shutdown" not in err  # not said a second time as a log record

    assert main(["trigger", "startup", "-c", str(site), "--yes"]) == 0
    out, err = capsys.readouterr()
    assert journaled_phase(tmp_path) == "normal"
    assert "phase recovering -> normal: recovered" in out
    assert err == ""
