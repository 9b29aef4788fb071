"""The Markdown retrospective, from a real journal: how it writes times before the outage,
the phases, the order of what happened at the same instant."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from upsguard.events import OverrideApplied, PhaseChanged
from upsguard.journal import Journal
from upsguard.journal.retrospective import story_from_journal
from upsguard.models import Phase
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
    section = text.split("## Phases, overrides and risks", 1)[1].split("\n## ", 1)[0]
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
    assert "- T-4.6s override: hold by ops (maintenance)" in text


def test_each_phase_is_a_line_of_its_own(journal: Journal) -> None:
    outage(journal)
    lines = moment_lines(markdown(journal))
    assert len(lines) == 4, lines
    assert all(line.startswith("- T") for line in lines), lines


def test_phase_changes_at_the_same_instant_come_in_the_order_journaled(journal: Journal) -> None:
    outage(journal)
    lines = moment_lines(markdown(journal))
    assert lines[-2:] == [
        "- T+1m phase: on_battery -> shedding (first)",
        "- T+1m phase: shedding -> shutting_down (second)",
    ]
