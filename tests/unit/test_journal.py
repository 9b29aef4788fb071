"""The journal on a real SQLite file: schema, what each event writes, reaping after a crash."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from upsguard.errors import PermanentError
from upsguard.events import (
    CacheModeChanged,
    OverrideApplied,
    PhaseChanged,
    PointOfNoReturn,
    ReadingTaken,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
    TargetAsked,
)
from upsguard.journal import Journal
from upsguard.journal.schema import VERSION
from upsguard.models import (
    CacheMode,
    Phase,
    PowerState,
    ResourceKind,
    RunId,
    StepId,
    StepState,
    UpsFlag,
    UpsName,
    UpsReading,
)
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec, RunState

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(seconds: float, *flags: UpsFlag, charge: float = 100.0) -> ReadingTaken:
    r = UpsReading(UpsName("ups1"), at(seconds), frozenset(flags), charge, 1200.0)
    return ReadingTaken(at(seconds), r)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.sqlite", readings_every=timedelta(minutes=1))
    yield j
    j.close()


def test_a_new_journal_is_wal_and_at_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "j.sqlite"
    Journal(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    assert oct(path.stat().st_mode & 0o777) == "0o600"  # who did what is nobody else's business


def test_a_journal_from_a_newer_upsguard_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {VERSION + 1}")
    db.close()
    with pytest.raises(PermanentError, match="newer than this upsguard"):
        Journal(path)


def test_readings_are_downsampled_while_normal_and_all_kept_on_battery(journal: Journal) -> None:
    for s in range(0, 120, 5):  # two minutes on line, every 5 s
        journal.write.record(reading(s, UpsFlag.OL))
    assert len(journal.read.readings()) == 2  # t=0 and t=60
    journal.write.record(reading(121, UpsFlag.OB, UpsFlag.DISCHRG))  # a change is always kept
    journal.write.record(
        PhaseChanged(at(125), Phase.NORMAL, Phase.ON_BATTERY, "on battery for 10s")
    )
    for s in range(126, 150, 5):
        journal.write.record(reading(s, UpsFlag.OB, UpsFlag.DISCHRG, charge=99.0))
    rows = journal.read.readings(limit=100)
    assert len(rows) == 3 + 5
    assert rows[0].status == "DISCHRG OB" and rows[0].at.endswith("Z")


R1 = RunId("r1")


def run_spec(run: str) -> RunSpec:
    return RunSpec(RunId(run), RunKind.SHUTDOWN, RunOrigin.POLICY, "runtime < plan + 5m", at(0))


def started(run: str, steps: int = 2) -> RunStarted:
    return RunStarted(at(0), run_spec(run), steps)


def test_runs_and_every_step_attempt_are_journaled(journal: Journal) -> None:
    journal.write.record(started("r1"))
    journal.write.record(StepStarted(at(1), R1, StepId("stop:vm1"), "guest_shutdown"))
    journal.write.record(
        StepFinished(at(9), R1, StepId("stop:vm1"), StepState.DONE, "vm1 shut down", 2, True)
    )
    journal.write.record(PointOfNoReturn(at(10), R1, StepId("stop:h1")))
    journal.write.record(StepStarted(at(10), R1, StepId("stop:h1"), "host_shutdown"))
    journal.write.record(
        StepFinished(at(40), R1, StepId("stop:h1"), StepState.FAILED, "h1: BMC said no")
    )
    journal.write.record(RunFinished(at(40), run_spec("r1"), RunOutcome.FAILED, "1 done, 1 failed"))
    (run,) = journal.read.runs()
    assert (run.state, run.point_of_no_return) == ("failed", "stop:h1")
    assert run.ended == "2026-03-01T12:00:40.000Z"
    vm1, h1 = run.steps
    assert (vm1.state, vm1.tries, vm1.fallback_used, vm1.started) == (
        "done",
        2,
        True,
        "2026-03-01T12:00:01.000Z",
    )
    assert (h1.state, h1.detail) == ("failed", "h1: BMC said no")
    texts = [e.text for e in journal.read.events()]
    assert "failed    stop:h1: h1: BMC said no" in texts
    assert [e.level for e in journal.read.events() if "stop:h1" in e.text][-1] == "error"


def test_a_stopping_service_leaves_its_run_interrupted_and_reap_finds_it(journal: Journal) -> None:
    journal.write.record(started("r1"))
    journal.write.record(StepStarted(at(1), R1, StepId("stop:vm1"), "guest_shutdown"))
    journal.write.record(StepFinished(at(2), R1, StepId("stop:vm1"), StepState.DONE, "off"))
    journal.write.record(StepStarted(at(2), R1, StepId("stop:vm2"), "guest_shutdown"))
    journal.write.record(
        StepFinished(at(3), R1, StepId("stop:vm2"), StepState.INTERRUPTED, "the service stopped")
    )
    journal.write.record(RunFinished(at(3), run_spec("r1"), RunOutcome.INTERRUPTED))
    (run,) = journal.write.reap(at(100))
    assert run.id == "r1" and run.state is RunState.INTERRUPTED and run.ended is None
    assert run.kind is RunKind.SHUTDOWN and run.origin is RunOrigin.POLICY
    assert [(s.step, s.state) for s in run.steps] == [
        ("stop:vm1", StepState.DONE),
        ("stop:vm2", StepState.INTERRUPTED),
    ]
    assert all(type(s.state) is StepState for s in run.steps)  # parsed, not text


def test_reap_marks_steps_a_killed_process_left_running(journal: Journal) -> None:
    journal.write.record(started("r1"))
    journal.write.record(StepStarted(at(1), R1, StepId("stop:vm1"), "guest_shutdown"))
    (run,) = journal.write.reap(at(50))  # the process died: no StepFinished, no RunFinished
    assert run.state is RunState.RUNNING and run.outcome is None
    assert [(s.step, s.state) for s in run.steps] == [("stop:vm1", StepState.ABANDONED)]
    journal.write.record(started("r1"))  # resumed under its own id
    journal.write.record(StepStarted(at(60), R1, StepId("stop:vm1"), "guest_shutdown"))
    journal.write.record(
        StepFinished(at(61), R1, StepId("stop:vm1"), StepState.DONE, "already off")
    )
    again = journal.read.run("r1")
    assert again is not None and again.resumed == 1
    assert [(s.attempt, s.state) for s in again.steps] == [(1, "abandoned"), (2, "done")]


def test_overrides_are_an_audit_trail_and_the_last_hold_counts(journal: Journal) -> None:
    assert journal.read.hold() is None
    journal.write.record(OverrideApplied(at(0), "alice", "hold", "generator test"))
    held = journal.read.hold()
    assert held is not None and (held.who, held.reason) == ("alice", "generator test")
    journal.write.record(OverrideApplied(at(5), "bob", "release", "test over"))
    assert journal.read.hold() is None
    assert [(o.who, o.action) for o in journal.read.overrides()] == [
        ("bob", "release"),
        ("alice", "hold"),
    ]
    assert journal.read.events()[-1].text == "override: release by bob: test over"


def test_cache_operations_and_phases_are_journaled(journal: Journal) -> None:
    journal.write.record(PhaseChanged(at(0), Phase.NORMAL, Phase.ON_BATTERY, "on battery for 10s"))
    journal.write.record(
        CacheModeChanged(at(0), "flash", "bcache0", CacheMode.WRITE_THROUGH, True, "ok")
    )
    assert journal.read.last_phase() is Phase.ON_BATTERY
    (op,) = journal.read.cache_ops()
    assert (op.cache, op.target, op.mode, op.ok) == ("flash", "bcache0", "write-through", True)
    assert journal.read.phases()[0].reason == "on battery for 10s"


def test_events_after_an_id_and_the_last_n(journal: Journal) -> None:
    for i in range(5):
        journal.write.record(OverrideApplied(at(i), "x", "hold", f"r{i}"))
    last_two = journal.read.events(after=-2)
    assert [e.text.split(": ")[-1] for e in last_two] == ["r3", "r4"]
    assert journal.read.events(after=last_two[0].id)[0].id == last_two[1].id


def test_old_readings_are_pruned(journal: Journal) -> None:
    journal.write.record(reading(0, UpsFlag.OL))
    journal.write.record(reading(86400 * 100, UpsFlag.OL))
    assert journal.write.prune_readings(at(86400 * 100), timedelta(days=90)) == 1
    assert len(journal.read.readings()) == 1


def test_a_runs_state_is_running_or_one_of_the_outcomes() -> None:
    assert {s.outcome for s in RunState} == {None, *RunOutcome}
    assert all(RunState(o.value).outcome is o for o in RunOutcome)


def test_a_request_of_a_step_done_earlier_in_its_run_is_still_pending(journal: Journal) -> None:
    """A resumed startup checks its done steps again (a power cycle may have undone them) and
    asks one: that request is under way even though an earlier attempt of the same step ended
    done. The earlier attempt hid it, and the next controller asked the host a second time
    (found by the outage machine: a platform whose reads came back unknown)."""
    write = journal.write.record
    write(started("startup-1"))
    write(StepStarted(at(0), RunId("startup-1"), StepId("start:h3"), "host_power_on"))
    write(StepFinished(at(0), RunId("startup-1"), StepId("start:h3"), StepState.DONE, "up"))
    write(StepStarted(at(2), RunId("startup-1"), StepId("start:h3"), "host_power_on"))
    write(
        TargetAsked(
            at(2),
            RunId("startup-1"),
            StepId("start:h3"),
            "vc",
            "h3",
            ResourceKind.HOST,
            PowerState.ON,
        )
    )
    write(StepFinished(at(2), RunId("startup-1"), StepId("start:h3"), StepState.CANCELLED, "abort"))
    pending = journal.read.pending_requests(at(-60))
    assert [(r.step, r.target, r.wanted) for r in pending] == [("start:h3", "h3", "on")]
