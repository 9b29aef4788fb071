"""What the outage found already off, read back from a journal filled with the events runs
send: the startup leaves those VMs off, and starts every VM it cannot be sure of."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.journaled import ALREADY, JournaledRuns
from upsguard.journal import Journal
from upsguard.journal.as_before import found_off
from upsguard.models import RunId, StepState
from upsguard.runs import RunKind, RunOutcome


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[JournaledRuns]:
    journal = Journal(tmp_path / "journal.sqlite")
    yield JournaledRuns(journal)
    journal.close()


def left_off(runs: JournaledRuns, startup: str = "startup-now") -> dict[str, str]:
    return {str(vm): str(run) for vm, run in found_off(runs.journal, RunId(startup)).items()}


def test_a_vm_the_shutdown_found_off_stays_off_and_one_it_stopped_starts(
    runs: JournaledRuns,
) -> None:
    shutdown = runs.run({"web": "stopped", "test": ALREADY})
    assert left_off(runs) == {"test": shutdown}


def test_a_vm_stopped_earlier_in_the_outage_is_started_though_the_shutdown_found_it_off(
    runs: JournaledRuns,
) -> None:
    runs.run({"batch": "stopped"}, kind=RunKind.SHEDDING)
    runs.run({"web": "stopped"}, outcome=RunOutcome.CANCELLED)  # mains back for a while
    runs.run({"batch": ALREADY, "web": ALREADY, "test": ALREADY})
    assert set(left_off(runs)) == {"test"}


def test_a_resumed_run_proves_nothing_off_a_step_that_did_not_end_done_neither(
    runs: JournaledRuns,
) -> None:
    """After a restart, a VM read off may be the run's own shutdown from before it; a step
    failed or skipped read nothing for sure."""
    runs.run({"web": ALREADY}, restarted=True)
    runs.run({"db": StepState.FAILED, "app": StepState.SKIPPED, "test": ALREADY})
    assert set(left_off(runs)) == {"test"}


def test_a_startup_done_closes_the_outage_one_that_failed_does_not(runs: JournaledRuns) -> None:
    runs.run({"web": "stopped", "old": ALREADY})
    runs.run({"web": "stopped"}, kind=RunKind.STARTUP)  # 'old' was left off
    runs.run({"web": ALREADY, "old": ALREADY})  # the next outage: web was stopped by hand
    runs.run({}, kind=RunKind.STARTUP, outcome=RunOutcome.FAILED)
    asking = runs.run({}, kind=RunKind.STARTUP, outcome=RunOutcome.INTERRUPTED)
    assert set(left_off(runs, asking)) == {"web", "old"}


def test_a_journal_that_cannot_be_read_leaves_nothing_off(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    JournaledRuns(journal).run({"test": ALREADY})
    journal.db.execute("DROP TABLE runs")
    try:
        assert found_off(journal, RunId("startup-now")) == {}
    finally:
        journal.close()
