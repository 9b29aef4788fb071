"""The controller that wins the lease never brings a finished outage back as a shutdown.

Writes made while alone, or that the store did not answer, are dropped, so a run's last
record can be missing from the store. Two interleavings the pair's review found:
- etcd loses its quorum mid-shutdown, both controllers finish alone, the mains return and
  everything boots; etcd answers again, and the winner resumed the old run, shutting down
  what had just booted;
- the mains return before the point of no return and the cancel's record is dropped; days
  later the leader restarts, and the other resumed the old shutdown on mains.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from tests.unit.test_outage_controller import Harness
from upsguard.clock import run_virtual
from upsguard.engine.pair import SharedRun
from upsguard.events import Notice, RunFinished, StepStarted
from upsguard.models import RunId, StepId, StepState
from upsguard.plugins.coordination.base import SharedLedger
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunRecord, RunSpec

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def spec(run: str, kind: RunKind = RunKind.SHUTDOWN) -> RunSpec:
    return RunSpec(RunId(run), kind, RunOrigin.POLICY, "runtime < plan + 2m", T0)


def test_a_run_older_than_one_that_finished_is_not_in_progress() -> None:
    """Its end was not recorded; the newer run that finished says the site went on."""
    old = RunRecord(spec("shutdown-1"))
    startup = RunRecord(spec("startup-2", RunKind.STARTUP), RunOutcome.DONE, ended=T0)
    assert SharedLedger(1, runs=(old, startup)).active is None
    assert SharedLedger(1, runs=(startup, old)).active == old


def shared(run: str) -> SharedRun:
    return SharedRun(spec(run), {StepId("stop:app"): StepState.DONE}, (), (), {})


def test_the_winner_does_not_resume_a_shutdown_while_the_mains_are_there() -> None:
    h = Harness(lambda t: "OL")

    async def go() -> RunId | None:
        controller = h.build()
        await h.drive(controller, 10)  # it reads the UPS, as a standby does
        run = shared("shutdown-1")
        resumed = await controller.lead(run, [RunRecord(run.spec)])
        await h.drive(controller, 200)
        return resumed

    assert run_virtual(go()) is None
    assert h.kinds(StepStarted) == []
    (ended,) = h.kinds(RunFinished)
    assert (ended.spec.id, ended.outcome) == ("shutdown-1", RunOutcome.ABANDONED)
    said = [n.message for n in h.kinds(Notice)]
    assert any("not resumed: every feed it concerns is on mains" in m for m in said), said


@pytest.mark.parametrize("ups", ["OB", "lost"], ids=["on battery", "not read"])
def test_the_winner_resumes_a_shutdown_on_battery_or_when_it_cannot_read_the_mains(
    ups: str,
) -> None:
    """Unknown is never good news: a UPS that cannot be read is no proof of mains."""
    h = Harness(lambda t: ups)

    async def go() -> RunId | None:
        controller = h.build()
        await h.drive(controller, 10)
        run = shared("shutdown-1")
        resumed = await controller.lead(run, [RunRecord(run.spec)])
        await asyncio.sleep(1)
        await controller.interrupt()
        return resumed

    assert run_virtual(go()) == "shutdown-1"
    assert [e.step for e in h.kinds(StepStarted)][:1] == ["stop:db"]


def test_a_standby_cut_off_from_the_store_does_not_adopt_a_stale_shutdown_on_mains() -> None:
    """The store silent, the followed ledger still holding a shutdown in progress (its end
    lost): going on alone with it would shut a running site down."""

    class Silent:
        """The standby's side of a pair whose store has been silent long enough."""

        def may_act(self) -> bool:
            return False

        def act_alone(self, reason: str) -> bool:
            self.went_alone = reason
            return True

        def shared_run(self) -> SharedRun:
            return shared("shutdown-1")

        def rejoin(self) -> bool:
            return False

        def debts_taken(self) -> set[str]:
            return set()

    h = Harness(lambda t: "OL")
    silent = Silent()

    async def go() -> None:
        controller = h.build(pair=silent)  # type: ignore[arg-type]  # stands in for a Pair
        controller.ledger.follow([RunRecord(spec("shutdown-1"))])
        await h.drive(controller, 60)

    run_virtual(go())
    assert not hasattr(silent, "went_alone")
    assert h.kinds(StepStarted) == []


def test_a_controller_alone_with_no_run_asks_to_rejoin_at_each_poll() -> None:
    class Alone:
        """This controller's side of a pair, finishing alone."""

        def __init__(self) -> None:
            self.asked = 0

        def may_act(self) -> bool:
            return True

        def rejoin(self) -> bool:
            self.asked += 1
            return False

        def take_debts(self) -> list[str]:
            return []

    h = Harness(lambda t: "OL")
    alone = Alone()

    async def go() -> None:
        controller = h.build(pair=alone)  # type: ignore[arg-type]  # stands in for a Pair
        await h.drive(controller, 30)

    run_virtual(go())
    assert alone.asked == 6  # every poll (5 s), the run over
