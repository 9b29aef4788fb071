"""One report per outage: the journal's runs grouped by the phases around them, and
``upsguard report --last`` telling the last outage whole (the mains failure, the shutdown,
the return of power, the startup) on one timeline with absolute times.

The journal is written with the events a controller journals, at times a fake clock gives
(``at``): the report's absolute times are those, never the wall clock's."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.sites import EXAMPLES, simple_site, site_from
from upsguard.cli import main
from upsguard.events import (
    OnBattery,
    PhaseChanged,
    PowerRestored,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
    UpsCommandSent,
)
from upsguard.journal import Journal
from upsguard.journal.outages import last_outage, outages
from upsguard.models import Phase, ResourceId, RunId, StepId, StepState
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SCHEMA4_DEMO = Path(__file__).parent.parent / "fixtures" / "journals" / "schema4-demo.sql"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


DRILL = RunSpec(RunId("drill-0"), RunKind.SHUTDOWN, RunOrigin.MANUAL, "manual: drill", at(-7200))
SHUTDOWN = RunSpec(RunId("shutdown-1"), RunKind.SHUTDOWN, RunOrigin.POLICY, "runtime", at(120))
STARTUP = RunSpec(RunId("startup-2"), RunKind.STARTUP, RunOrigin.POLICY, "on line 3m", at(900))


@pytest.fixture
def site_file(tmp_path: Path) -> Path:
    site_from(tmp_path, {**simple_site(), "journal": str(tmp_path / "journal.sqlite")})
    return tmp_path / "site.yaml"


@pytest.fixture
def journal(site_file: Path) -> Iterator[Journal]:
    j = Journal(site_file.parent / "journal.sqlite")
    yield j
    j.close()


def run(journal: Journal, spec: RunSpec, step: str, start: float, took: float) -> None:
    """A run of one step; a person's run records itself just before the phase it forces."""
    record, sid = journal.write.record, StepId(step)
    resource = ResourceId(step.split(":")[1])
    record(RunStarted(spec.at, spec, 1))
    record(StepStarted(at(start), spec.id, sid, "guest_shutdown", resource))
    done = StepFinished(at(start + took), spec.id, sid, StepState.DONE, "ok", resource=resource)
    record(done)
    record(RunFinished(at(start + took + 1), spec, RunOutcome.DONE, "1 done"))


def drill(journal: Journal) -> None:
    """Two hours before the outage, a person's shutdown drill on mains, and its end."""
    record = journal.write.record
    record(RunStarted(DRILL.at, DRILL, 1))
    record(PhaseChanged(at(-7200 + 0.002), Phase.NORMAL, Phase.SHUTTING_DOWN, "manual: drill"))
    record(StepStarted(at(-7199), DRILL.id, StepId("stop:web"), "guest_shutdown"))
    record(StepFinished(at(-7190), DRILL.id, StepId("stop:web"), StepState.DONE, "ok"))
    record(RunFinished(at(-7189), DRILL, RunOutcome.DONE, "1 done"))
    record(PhaseChanged(at(-7000), Phase.SHUTTING_DOWN, Phase.NORMAL, "manual startup"))


def whole_outage(journal: Journal) -> None:
    """The mains fail at 11:59:50 (the phase follows 10 s later), the shutdown runs, the UPS
    refuses its load cycle, the mains are back at 12:10:00, the startup runs."""
    record = journal.write.record
    record(OnBattery(at(-10), "feed0", "ups1 on-battery"))
    record(PhaseChanged(at(0), Phase.NORMAL, Phase.ON_BATTERY, "on battery for 10s"))
    record(PhaseChanged(at(120), Phase.ON_BATTERY, Phase.SHUTTING_DOWN, "runtime < plan"))
    run(journal, SHUTDOWN, "stop:db", 120, 30)
    refused = "UPS 'ups1' on upsd 127.0.0.1:3493: shutdown.return: CMD-NOT-SUPPORTED"
    record(UpsCommandSent(at(152), "ups1", "shutdown.return", False, refused, SHUTDOWN.id))
    record(PhaseChanged(at(152), Phase.SHUTTING_DOWN, Phase.DOWN, "shutdown runbook finished"))
    record(PowerRestored(at(600), "feed0"))
    record(PhaseChanged(at(610), Phase.DOWN, Phase.RECOVERING, "power back"))
    run(journal, STARTUP, "start:db", 900, 60)
    record(PhaseChanged(at(962), Phase.RECOVERING, Phase.NORMAL, "recovered"))


def report(site_file: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["report", *args, "-c", str(site_file), "--format", "md"]) == 0
    return capsys.readouterr().out


def section(text: str, title: str) -> list[str]:
    part = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return [line for line in part.splitlines() if line]


def test_an_outage_groups_its_shutdown_and_startup_runs_and_a_drill_is_one_of_its_own(
    journal: Journal,
) -> None:
    drill(journal)
    whole_outage(journal)
    found = outages(journal)
    assert [[r.id for r in o.runs] for o in found] == [["drill-0"], ["shutdown-1", "startup-2"]]
    assert [(o.mains_failed, o.mains_back) for o in found] == [(None, None), (at(-10), at(600))]
    assert [(o.started, o.ended) for o in found] == [(at(-7199.998), at(-7000)), (at(0), at(962))]


def test_a_run_that_moved_no_phase_is_an_outage_of_its_own(journal: Journal) -> None:
    whole_outage(journal)
    only = RunSpec(RunId("startup-3"), RunKind.STARTUP, RunOrigin.MANUAL, "only", at(3600))
    run(journal, only, "start:app", 3600, 5)
    last = last_outage(journal)
    assert last is not None
    assert [r.id for r in last.runs] == ["startup-3"] and last.mains_failed is None
    assert [s.step for s in last.runs[0].steps] == ["start:app"]


def test_report_last_tells_the_last_outage_whole_with_absolute_times(
    site_file: Path, journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    drill(journal)
    whole_outage(journal)
    text = report(site_file, capsys, "--last")
    assert "T+0 = 2026-03-01 11:59:50 UTC, the mains failure." in text
    assert "- **Mains failed:** 2026-03-01 11:59:50 UTC" in text
    assert "- **Mains back:** 2026-03-01 12:10:00 UTC (T+10m10s)" in text
    runs = [line.split(" | ")[0] for line in section(text, "Runs")[2:]]
    assert runs == ["| shutdown-1", "| startup-2"]  # the drill is another outage
    timeline = section(text, "What happened, in order")
    assert (
        timeline[0] == "- 11:59:50 (T+0s) **MAINS FAILED**: feed feed0 on battery: ups1 on-battery"
    )
    assert "- 12:10:00 (T+10m10s) **MAINS BACK**: feed feed0 on mains again" in timeline
    failed = [line for line in timeline if "UPS COMMAND FAILED" in line]
    assert failed == [
        "- 12:02:32 (T+2m42s) **UPS COMMAND FAILED**: UPS ups1: shutdown.return: "
        "UPS 'ups1' on upsd 127.0.0.1:3493: shutdown.return: CMD-NOT-SUPPORTED"
    ]
    kinds = [line.split(") ", 1)[1].split(":", 1)[0] for line in timeline]
    assert kinds.index("**MAINS FAILED**") < kinds.index("**MAINS BACK**")
    starts = [line for line in timeline if " run " in line and "starts" in line]
    assert [s.split(" run ")[1].split()[0] for s in starts] == ["shutdown-1", "startup-2"]
    steps = section(text, "Timeline: every step, planned against actual")
    assert any("| 12:15:00 (T+15m10s) | 1m |" in line for line in steps)  # start:db's start


def test_report_of_one_run_still_tells_that_run_alone(
    site_file: Path, journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    drill(journal)
    whole_outage(journal)
    text = report(site_file, capsys, "--run", "shutdown-1")
    assert text.startswith("# Outage report: shutdown run shutdown-1\n")
    assert [line.split(" | ")[0] for line in section(text, "Runs")[2:]] == ["| shutdown-1"]
    assert "T+0 = 2026-03-01 11:59:50 UTC, the mains failure." in text

    drilled = report(site_file, capsys, "drill-0")
    assert "- **No mains failure:** a drill, or runs a person asked for" in drilled
    assert "T+0 = 2026-03-01 10:00:00 UTC." in drilled  # the phase change the drill forced


def test_report_last_of_an_old_journal_covers_its_whole_outage(
    site_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo journal of schema 4 (events without payload): its three runs, one outage."""
    db = sqlite3.connect(site_file.parent / "journal.sqlite")
    db.executescript(SCHEMA4_DEMO.read_text())
    db.close()
    text = report(site_file, capsys, "--last")
    assert len(section(text, "Runs")) == 2 + 3
    assert "- **Mains failed:** 2026-01-01 00:00:30 UTC" in text
    assert "- **Mains back:** 2026-01-01 00:16:30 UTC (T+16m)" in text


def test_a_simulated_outage_reads_like_a_real_one_on_its_virtual_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The homelab example, the mains gone for 30 minutes from T+1m of the scenario."""
    scenario = tmp_path / "back.yaml"
    scenario.write_text(
        "site: homelab\nname: mains back\noutage: {at: 1m, duration: 30m}\nhorizon: 2h\n"
    )
    out = tmp_path / "report.md"
    site = EXAMPLES / "homelab.yaml"
    assert (
        main(["simulate", "-c", str(site), "--scenario", str(scenario), "--report", str(out)]) == 0
    )
    timeline = capsys.readouterr().out
    text = out.read_text()
    assert "Times are UTC on the dry run's virtual clock" in text
    assert "T+0 = 2026-01-01 00:00:00 UTC, the start of the scenario" in text
    kinds = [line.split(" | ")[1] for line in section(text, "Runs")[2:]]
    assert kinds == ["shedding", "shutdown", "startup"]
    (command,) = section(text, "UPS commands")[2:]
    assert "| cp1500 | shutdown.return | sent |" in command
    # one T+ for the report, its verdict and simulate's timeline (it had two: the verdict's
    # from the scenario's start, the rest from the mains failure)
    started = [
        "T+" + line[2:].split()[0] for line in timeline.splitlines() if "runbook started" in line
    ]
    shown = [line.split(" | ")[4] for line in section(text, "Runs")[2:]]
    assert [s.split("(")[1].rstrip(")") for s in shown] == started
    assert "counts its T+" not in text
