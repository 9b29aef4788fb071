"""The Markdown retrospective, from a real journal: how it writes times (the wall clock in
UTC beside T+, before the outage too), the phases, the order of what happened at the same
instant, the UPS commands."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from upsguard.events import OverrideApplied, PhaseChanged, UpsCommandSent
from upsguard.journal import Journal
from upsguard.journal.retrospective import story_from_journal
from upsguard.models import Phase, RunId
from upsguard.reports import render
from upsguard.simulation.demo import demo_site

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.sqlite")
    yield j
    j.close()


def markdown(journal: Journal) -> str:
    story = story_from_journal(journal, demo_site(), [], "an outage", "journal")
    return render.report(story, "md")


def moment_lines(text: str) -> list[str]:
    section = text.split("## What happened, in order", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line]


def outage(journal: Journal) -> None:
    """A hold 4.6 s before the site went on battery, then two phase changes journaled at
    the same instant."""
    journal.write.record(OverrideApplied(at(-4.6), "ops", "hold", "maintenance"))
    journal.write.record(PhaseChanged(at(0), Phase.NORMAL, Phase.ON_BATTERY, "on battery"))
    journal.write.record(PhaseChanged(at(60), Phase.ON_BATTERY, Phase.SHEDDING, "first"))
    journal.write.record(PhaseChanged(at(60), Phase.SHEDDING, Phase.SHUTTING_DOWN, "second"))


def test_a_moment_before_the_outage_is_t_minus(journal: Journal) -> None:
    outage(journal)
    text = markdown(journal)
    assert "T+-" not in text
    assert "- 11:59:55 (T-4.6s) override: hold by ops (maintenance)" in text


def test_each_phase_is_a_line_of_its_own(journal: Journal) -> None:
    outage(journal)
    lines = moment_lines(markdown(journal))
    assert len(lines) == 4, lines
    assert all(line.startswith(("- 11:59:55 (T-", "- 12:0")) for line in lines), lines


def test_phase_changes_at_the_same_instant_come_in_the_order_journaled(journal: Journal) -> None:
    outage(journal)
    lines = moment_lines(markdown(journal))
    assert lines[-2:] == [
        "- 12:01:00 (T+1m) phase: on_battery -> shedding (first)",
        "- 12:01:00 (T+1m) phase: shedding -> shutting_down (second)",
    ]


def section(text: str, title: str) -> str:
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_each_ups_command_shows_with_its_answer_a_refused_one_visibly(journal: Journal) -> None:
    outage(journal)
    refused = "UPS 'cp1500' on 127.0.0.1:3493: shutdown.return: CMD-NOT-SUPPORTED"
    run = RunId("shutdown-1")
    journal.write.record(UpsCommandSent(at(400), "cp1500", "shutdown.return", False, refused, run))
    journal.write.record(UpsCommandSent(at(401), "ups2", "load.off.delay", True, "", run))
    rows = [r for r in section(markdown(journal), "UPS commands").splitlines() if r.startswith("|")]
    assert rows[2:] == [
        f"| 12:06:40 (T+6m40s) | cp1500 | shutdown.return | **FAILED**: {refused} | shutdown-1 |",
        "| 12:06:41 (T+6m41s) | ups2 | load.off.delay | sent | shutdown-1 |",
    ]


def test_a_report_says_when_no_ups_command_was_sent(journal: Journal) -> None:
    outage(journal)
    assert "No command was sent to a UPS." in section(markdown(journal), "UPS commands")


def test_a_refused_ups_command_is_on_the_timeline_in_capitals(journal: Journal) -> None:
    outage(journal)
    journal.write.record(
        UpsCommandSent(at(400), "cp1500", "shutdown.return", False, "CMD-NOT-SUPPORTED")
    )
    assert moment_lines(markdown(journal))[-1] == (
        "- 12:06:40 (T+6m40s) **UPS COMMAND FAILED**: UPS cp1500: shutdown.return: "
        "CMD-NOT-SUPPORTED"
    )


def test_times_are_utc_and_a_moment_past_midnight_has_its_date(journal: Journal) -> None:
    outage(journal)
    journal.write.record(OverrideApplied(at(12 * 3600 + 5), "ops", "release", "over"))
    text = markdown(journal)
    assert "Times are UTC; T+0 = 2026-03-01 12:00:00 UTC." in text
    assert "- 2026-03-02 00:00:05 (T+12h00m05s) override: release by ops (over)" in text
