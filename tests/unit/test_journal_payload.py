"""Events keep their typed fields (the ``payload`` column, schema 5), and a journal written
before that schema opens migrated with the same runs, steps and report."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from upsguard.events import (
    CacheClean,
    Notice,
    RiskAccepted,
    RunStarted,
    StepFinished,
    StepStarted,
)
from upsguard.journal import Journal
from upsguard.journal.payload import fields_of, plain
from upsguard.journal.retrospective import story_from_journal
from upsguard.journal.rows import EventRow
from upsguard.journal.schema import VERSION
from upsguard.models import RunId, StepId, StepState
from upsguard.runs import RunKind, RunOrigin, RunSpec, RunState
from upsguard.simulation.demo import demo_site

FIXTURES = Path(__file__).parent.parent / "fixtures" / "journals"
SCHEMA4_DEMO = FIXTURES / "schema4-demo.sql"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
R1 = RunId("r1")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.sqlite")
    yield j
    j.close()


def dumped(sql: str) -> list[tuple[object, ...]]:
    """What the fixture's SQL holds, read straight from its tables (no upsguard code)."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA4_DEMO.read_text())
    try:
        return list(db.execute(sql).fetchall())
    finally:
        db.close()


@pytest.fixture
def schema4(tmp_path: Path) -> Iterator[Journal]:
    """The demo's journal as the previous release wrote it, opened (and so migrated) now."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA4_DEMO.read_text())
    assert db.execute("PRAGMA user_version").fetchone()[0] == 4
    db.close()
    j = Journal(path)
    yield j
    j.close()


def test_a_schema4_journal_opens_migrated_with_the_same_runs_and_steps(schema4: Journal) -> None:
    assert schema4.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    runs = dumped("SELECT id, kind, state FROM runs ORDER BY started")
    steps = dumped("SELECT run, step, state FROM steps ORDER BY id")
    assert (len(runs), len(steps)) == (3, 15)

    read = list(reversed(schema4.read.runs()))
    assert [(r.id, r.kind, r.state) for r in read] == runs
    assert all(r.state is RunState.DONE and type(r.kind) is RunKind for r in read)
    assert [(s.run, s.step, s.state) for r in read for s in r.steps] == steps
    assert all(s.state is StepState.DONE for r in read for s in r.steps)

    story = story_from_journal(schema4, demo_site(), read, "the demo", "journal")
    assert [r.facts.id for r in story.runs] == [r[0] for r in runs]
    told = [(r.facts.id, s.id, s.state) for r in story.runs for s in r.steps]
    assert sorted(told) == sorted(steps)  # the report tells every step, each in its state


def test_events_of_a_schema4_journal_have_no_payload_and_new_ones_do(schema4: Journal) -> None:
    old = schema4.read.events(after=0, limit=1000)
    assert len(old) == len(dumped("SELECT id FROM events")) and old
    assert all(e.payload is None for e in old)
    schema4.write.record(Notice(at(0), "after the upgrade"))
    (new,) = schema4.read.events(after=old[-1].id)
    assert new.payload == {"message": "after the upgrade", "level": "info", "extra": {}}


def test_a_step_outcome_names_its_state_and_a_risk_its_cache(journal: Journal) -> None:
    spec = RunSpec(R1, RunKind.SHUTDOWN, RunOrigin.POLICY, "low battery", at(0))
    journal.write.record(RunStarted(at(0), spec, 1))
    journal.write.record(StepStarted(at(1), R1, StepId("stop:h1"), "host_shutdown"))
    journal.write.record(RiskAccepted(at(2), "esx01-flash", 4096, "the critical floor"))
    journal.write.record(CacheClean(at(3), "esx01-flash", 12.5))
    journal.write.record(
        StepFinished(at(4), R1, StepId("stop:h1"), StepState.FAILED, "BMC said no", attempts=3)
    )
    events = {e.kind: e for e in journal.read.events()}
    assert events["RiskAccepted"].payload == {
        "cache": "esx01-flash",
        "dirty_bytes": 4096,
        "why": "the critical floor",
    }
    assert events["CacheClean"].payload == {"cache": "esx01-flash", "waited_s": 12.5}
    finished = events["StepFinished"].payload
    assert finished is not None
    assert (finished["step"], finished["state"], finished["attempts"]) == ("stop:h1", "failed", 3)
    started = events["RunStarted"].payload
    assert started is not None
    assert started["spec"]["kind"] == "shutdown" and started["spec"]["at"].endswith("Z")


def test_the_line_listener_hears_the_payload_the_table_keeps(tmp_path: Path) -> None:
    heard: list[EventRow] = []
    j = Journal(tmp_path / "j.sqlite", on_line=heard.append)
    try:
        j.write.record(CacheClean(at(3), "nvme-cache", 0.0))
        assert [e.payload for e in heard] == [e.payload for e in j.read.events()]
    finally:
        j.close()


def test_values_json_cannot_hold_are_kept_plain() -> None:
    assert plain(float("inf")) is None
    assert plain(timedelta(minutes=2)) == 120.0
    assert plain(frozenset({"b", "a"})) == ["a", "b"]
    assert plain(object) == str(object)  # kept as its text, never refused
    assert "at" not in fields_of(Notice(at(0), "x"))


def test_the_cache_timeline_reads_the_cache_from_the_payload_not_the_words(
    journal: Journal,
) -> None:
    journal.write.record(Notice(at(0), "the outage begins"))
    journal.write.record(RiskAccepted(at(5), "nvme cache/1", 4096, "the critical floor"))
    journal.write.record(CacheClean(at(9), "nvme cache/1", 9.0))
    story = story_from_journal(journal, demo_site(), [], "no run", "journal")
    assert [(c.cache, c.dirty_bytes) for c in story.caches] == [
        ("nvme cache/1", None),  # a name the words of the line could not give back
        ("nvme cache/1", 0),
    ]


def test_old_events_without_payload_leave_no_cache_moment_but_flips_stay(
    schema4: Journal,
) -> None:
    runs = list(reversed(schema4.read.runs()))
    story = story_from_journal(schema4, demo_site(), runs, "the demo", "journal")
    assert [(c.cache, c.note) for c in story.caches] == [
        ("esx01-flash", "esx01-flash -> write-through"),
        ("esx01-flash", "esx01-flash -> write-back"),
    ]


def test_migration_marks_the_old_steps_of_group_members(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA4_DEMO.read_text())
    with db:
        db.execute(
            "INSERT INTO steps (run, step, action, attempt, started, ended, state, detail,"
            " resource) VALUES (?, 'stop:app/app-01', 'guest_shutdown', 1, ?, ?, 'done', '',"
            " 'app')",
            ("shutdown-20260101T000235.000Z-2", "2026-01-01T00:02:35.000Z", "2026-01-01T00:03:00Z"),
        )
    db.close()
    j = Journal(path)
    try:
        steps = j.read.steps("shutdown-20260101T000235.000Z-2")
        assert {s.step for s in steps if s.member} == {"stop:app/app-01"}
    finally:
        j.close()
