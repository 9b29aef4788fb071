"""The report of a startup against the site before the outage: what came back as it was, what
was left off as it was, and what differs (a VM off before and running now, one not back), so
a person sees at a glance whether the site is as they left it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.journaled import ALREADY, JournaledRuns
from upsguard.journal import Journal
from upsguard.journal.retrospective import story_from_journal
from upsguard.models import StepState
from upsguard.reports import render
from upsguard.runs import RunKind
from upsguard.simulation.demo import demo_site

TITLE = "## Back as before the outage?"


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[JournaledRuns]:
    journal = Journal(tmp_path / "journal.sqlite")
    yield JournaledRuns(journal)
    journal.close()


def report(runs: JournaledRuns, fmt: str = "md") -> str:
    rows = runs.journal.read.runs(limit=10)
    story = story_from_journal(runs.journal, demo_site(), rows, "an outage", "journal")
    return render.report(story, fmt)


def way_back(text: str) -> list[str]:
    section = text.split(TITLE, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line]


def outage_and_startup(runs: JournaledRuns) -> None:
    """dc01 and nas01 were off before the shutdown; the startup left dc01 off, started
    nas01, failed app, and never reached web and esx02 (differences come in plan order)."""
    runs.run(
        {
            "web": "stopped",
            "app": "stopped",
            "sql01": "stopped",
            "dc01": ALREADY,
            "esx01": "stopped",
            "nas01": ALREADY,
        }
    )
    runs.run(
        {
            "nas01": "started",
            "esx01": "started",
            "dc01": StepState.SKIPPED,
            "sql01": "started",
            "app": StepState.FAILED,
        },
        kind=RunKind.STARTUP,
    )


def test_the_startup_says_what_is_back_what_was_left_off_and_what_differs(
    runs: JournaledRuns,
) -> None:
    outage_and_startup(runs)
    assert way_back(report(runs)) == [
        "startup run startup-2: 2 resource(s) back as before the outage.",
        "- left off, as before the outage: dc01",
        "- **differs** nas01: off before the outage (found off by run shutdown-1), running now",
        "- **differs** esx02: not back (never started)",
        "- **differs** app: not back (failed: failed)",
        "- **differs** web: not back (never started)",
    ]


def test_the_web_report_marks_each_difference(runs: JournaledRuns) -> None:
    outage_and_startup(runs)
    html = report(runs, "html")
    assert html.count('class="differs"') == 4
    assert 'data-resource="nas01"' in html


def test_a_story_without_a_startup_has_no_way_back(runs: JournaledRuns) -> None:
    runs.run({"web": "stopped"})
    assert TITLE not in report(runs)
