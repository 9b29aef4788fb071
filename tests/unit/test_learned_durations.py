"""Durations learned from the journal: filled through ``Journal.record`` with the events a run
sends, read back as median and p90 per resource and direction, and used by the planner,
which says where each figure came from."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.sites import site_from
from upsguard.cli import main
from upsguard.events import RunFinished, RunStarted, StepFinished, StepStarted
from upsguard.journal import Journal
from upsguard.journal.learned import learned_durations
from upsguard.models import Direction, ResourceId, RunId, StepId, StepState
from upsguard.runbooks import render
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def site_data(journal: Path) -> dict[str, Any]:
    return {
        "site": "learn",
        "journal": str(journal),
        "ups": [
            {"name": "ups1", "simulated": {}, "runtime_at": {"minutes": 30, "load_watts": 400}}
        ],
        "platforms": {
            "vc": {"type": "simulated", "guest_shutdown": "40s"},
            "cmd": {"type": "command"},
        },
        "resources": [
            {"id": "db", "kind": "vm", "platform": "vc", "runs_on": ["h1"]},
            {"id": "app", "kind": "vm", "platform": "vc", "runs_on": ["h1"], "depends_on": ["db"]},
            {
                "id": "nas",
                "kind": "command",
                "platform": "cmd",
                "shutdown": "true",
                "estimate": {"stop": "90s"},
            },
            {
                "id": "h1",
                "kind": "host",
                "platform": "cmd",
                "depends_on": ["nas"],
                "shutdown": "true",
            },
        ],
    }


class RunWriter:
    """Sends a journal the events of runs, as the executor would."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.count = 0

    def run(
        self,
        steps: dict[str, float],
        *,
        kind: RunKind = RunKind.SHUTDOWN,
        origin: RunOrigin = RunOrigin.POLICY,
        already: frozenset[str] = frozenset(),
        states: dict[str, StepState] | None = None,
    ) -> str:
        """One run whose steps (id -> seconds) run one after the other; those in ``already``
        found their targets there (as the executor says of a VM already off)."""
        self.count += 1
        start = T0 + timedelta(hours=self.count)
        run = RunId(f"{kind}-{self.count}")
        spec = RunSpec(run, kind, origin, "test", start)
        record = self.journal.write.record
        record(RunStarted(start, spec, len(steps)))
        at = start
        for step, seconds in steps.items():
            resource = ResourceId(step.partition(":")[2].partition("/")[0])
            record(StepStarted(at, run, StepId(step), "guest_shutdown", resource))
            at += timedelta(seconds=seconds)
            state = (states or {}).get(step, StepState.DONE)
            there = step in already
            detail = f"{resource} already off" if there else f"{step} shut down"
            record(
                StepFinished(
                    at, run, StepId(step), state, detail, resource=resource, already_there=there
                )
            )
        record(RunFinished(at, spec, RunOutcome.DONE, "done"))
        return run


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite")
    yield j
    j.close()


def test_median_and_p90_per_resource_and_direction_from_real_runs_and_drills(
    journal: Journal,
) -> None:
    runs = RunWriter(journal)
    for seconds in (30.0, 40.0, 50.0):
        runs.run({"stop:db": seconds, "stop:app": 10.0})
    runs.run({"stop:db": 200.0}, origin=RunOrigin.MANUAL)  # a drill counts too
    runs.run({"start:db": 90.0}, kind=RunKind.STARTUP)

    learned = learned_durations(journal)

    db = learned[(ResourceId("db"), Direction.SHUTDOWN)]
    assert (db.runs, db.median_s) == (4, 45.0)
    assert 50.0 < db.p90_s <= 200.0  # interpolated, never above the slowest run
    assert db.source == "p90 of 4 runs"
    assert learned[(ResourceId("db"), Direction.STARTUP)].median_s == 90.0
    assert learned[(ResourceId("app"), Direction.SHUTDOWN)].source == "p90 of 3 runs"


def test_steps_that_had_nothing_to_do_or_did_not_finish_teach_nothing(journal: Journal) -> None:
    runs = RunWriter(journal)
    runs.run({"stop:db": 40.0})
    runs.run({"stop:db": 0.5}, already=frozenset({"stop:db"}))
    runs.run({"stop:db": 300.0}, states={"stop:db": StepState.FAILED})
    runs.run({"stop:db": 600.0}, states={"stop:db": StepState.INTERRUPTED})

    db = learned_durations(journal)[(ResourceId("db"), Direction.SHUTDOWN)]

    assert (db.runs, db.median_s, db.p90_s) == (1, 40.0, 40.0)


def test_only_the_newest_runs_count_and_before_gives_what_a_run_knew(journal: Journal) -> None:
    runs = RunWriter(journal)
    runs.run({"stop:db": 500.0})  # an old, slow guest since fixed
    for _ in range(3):
        runs.run({"stop:db": 20.0})

    assert learned_durations(journal, runs=3)[(ResourceId("db"), Direction.SHUTDOWN)].p90_s == 20.0
    before_second = T0 + timedelta(hours=2)
    early = learned_durations(journal, before=before_second)
    assert early[(ResourceId("db"), Direction.SHUTDOWN)].median_s == 500.0


def test_members_of_an_expanded_group_teach_a_per_member_figure(journal: Journal) -> None:
    RunWriter(journal).run({"stop:web/web-01": 30.0, "stop:web/web-02": 50.0})

    web = learned_durations(journal)[(ResourceId("web"), Direction.SHUTDOWN)]

    assert web.per_member and web.median_s == 40.0 and web.runs == 1


def test_the_plan_says_where_each_estimate_came_from(tmp_path: Path, journal: Journal) -> None:
    site = site_from(tmp_path, site_data(tmp_path / "journal.sqlite"))
    runs = RunWriter(journal)
    for seconds in (30.0, 40.0, 50.0, 60.0):
        runs.run({"stop:db": seconds})
    learned = learned_durations(journal)

    plan = Planner(site, durations=learned).plan(Direction.SHUTDOWN)

    sources: dict[str, tuple[str, float]] = {
        s.resource: (s.estimate_source, s.estimate_s) for s in plan.steps
    }
    assert sources["db"][0] == "p90 of 4 runs" and 50.0 < sources["db"][1] <= 60.0
    assert sources["app"] == ("platform", 40.0)  # the simulated platform's typical figure
    assert sources["nas"] == ("estimate", 90.0)  # the site file's estimate
    assert sources["h1"] == ("default", 180.0)  # upsguard's default for a host
    configured = Planner(site).plan(Direction.SHUTDOWN)
    assert {s.estimate_source for s in configured.steps} == {"platform", "estimate", "default"}
    assert "(p90 of 4 runs)" in render.plan_text(plan)
    as_json = json.loads(render.plan_json(plan))
    assert as_json["estimate_sources"] == {"learned": 1, "platform": 1, "estimate": 1, "default": 1}
    assert {s["id"]: s["estimate_source"] for s in as_json["steps"]}["stop:db"] == "p90 of 4 runs"


def test_plan_cli_learns_from_the_sites_journal_unless_told_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "site.yaml"
    site_from(tmp_path, site_data(tmp_path / "journal.sqlite"))  # writes site.yaml
    assert main(["plan", "shutdown", "-c", str(path)]) == 0  # no journal yet: configured
    assert "p90" not in capsys.readouterr().out

    journal = Journal(tmp_path / "journal.sqlite")
    runs = RunWriter(journal)
    for _ in range(3):
        runs.run({"stop:db": 300.0, "stop:app": 12.0})
    journal.close()

    assert main(["plan", "shutdown", "-c", str(path)]) == 0
    learned = capsys.readouterr().out
    assert "stop:db" in learned and "(p90 of 3 runs)" in learned
    assert main(["plan", "shutdown", "-c", str(path), "--durations", "configured"]) == 0
    assert "p90" not in capsys.readouterr().out


@contextlib.contextmanager
def journal_dir_closed_to_us(directory: Path) -> Iterator[None]:
    """The journal's directory, closed to the user running the command: mode 0700 and, when
    the tests run as root (whom no mode stops), the command runs as nobody for a while."""
    directory.chmod(0o700 if os.geteuid() == 0 else 0o000)
    try:
        if os.geteuid() == 0:
            os.seteuid(65534)
            try:
                yield
            finally:
                os.seteuid(0)
        else:
            yield
    finally:
        directory.chmod(0o700)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may read (pytest's own are its user's alone)."""
    path = Path(tempfile.mkdtemp(prefix="upsguard-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_a_journal_the_user_may_not_look_at_plans_with_configured_and_says_why(
    open_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = open_dir / "private"
    private.mkdir()
    journal = Journal(private / "journal.sqlite")
    RunWriter(journal).run({"stop:db": 30.0})
    journal.close()
    path = open_dir / "site.yaml"
    site_from(open_dir, site_data(private / "journal.sqlite"))

    with journal_dir_closed_to_us(private):
        code = main(["plan", "shutdown", "-c", str(path)])
        report = main(["report", "--last", "-c", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and "p90" not in out
    assert "cannot look at it (Permission denied)" in err and "Traceback" not in err
    assert report == 1
    assert err.strip().splitlines()[-1] == (
        f"upsguard: journal {private / 'journal.sqlite'}: cannot look at it (Permission denied):"
        " check the permissions of its directory, or run as a user of the site's socket_group"
    )


def test_one_quick_drill_does_not_shrink_the_plan_the_runtime_trigger_counts_on(
    tmp_path: Path, journal: Journal
) -> None:
    """A drill whose steps were quick once taught a p90 of a single run, with no floor, and
    cut the plan from minutes to seconds: the runtime trigger would then fire too late."""
    site = site_from(tmp_path, site_data(tmp_path / "journal.sqlite"))
    configured = Planner(site).plan(Direction.SHUTDOWN)
    runs = RunWriter(journal)
    runs.run({"stop:db": 2.0, "stop:app": 1.0, "stop:h1": 3.0, "stop:nas": 1.0})

    one_run = Planner(site, durations=learned_durations(journal)).plan(Direction.SHUTDOWN)
    assert one_run.estimate_s == configured.estimate_s  # one run teaches nothing yet

    for _ in range(2):
        runs.run({"stop:db": 2.0, "stop:app": 1.0, "stop:h1": 3.0, "stop:nas": 1.0})
    three = Planner(site, durations=learned_durations(journal)).plan(Direction.SHUTDOWN)
    assert three.estimate_s == configured.estimate_s  # quicker runs never lower it by default
    db = three.step(StepId("stop:db"))
    assert db.learned is not None and db.configured_s == 40.0 and db.estimate_s == 40.0
    assert "learned below the configured 40s" in render.plan_text(three)


def test_a_site_may_let_learned_figures_lower_the_plan_down_to_its_floor(tmp_path: Path) -> None:
    data = site_data(tmp_path / "journal.sqlite")
    data["policies"] = {"learning": {"may_lower_to_pct": 50}}
    site = site_from(tmp_path, data)
    journal = Journal(tmp_path / "journal.sqlite")
    runs = RunWriter(journal)
    for seconds in (10.0, 30.0, 35.0):
        runs.run({"stop:db": seconds})
    plan = Planner(site, durations=learned_durations(journal)).plan(Direction.SHUTDOWN)
    journal.close()
    db = plan.step(StepId("stop:db"))
    assert db.learned is not None and 30.0 < db.learned.p90_s < 35.0
    assert db.estimate_s == db.learned.p90_s  # above half of the configured 40s: trusted
    assert db.configured_s == 40.0

    journal = Journal(tmp_path / "quick.sqlite")  # three quick runs, and nothing else
    quick = RunWriter(journal)
    for _ in range(3):
        quick.run({"stop:db": 1.0})
    lower = Planner(site, durations=learned_durations(journal)).plan(Direction.SHUTDOWN)
    journal.close()
    assert lower.step(StepId("stop:db")).estimate_s == 20.0  # held at half of 40s
