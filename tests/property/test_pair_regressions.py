"""The counterexamples the pair's state machine found, each kept as the short story it shrank
to, replayed step by step with every invariant checked after each step and the site's return
checked at the end (``PairMachine.teardown``).

Each failed on the pair as it was before its fix; the test's docstring says what broke.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.property.lab import LabUps
from tests.property.test_outage_regressions import outage_until
from tests.property.test_pair_invariants import PairMachine
from upsguard.events import UpsCommandSent
from upsguard.models import LinkState

Step = tuple[str, dict[str, Any]]


def replay(*steps: Step) -> PairMachine:
    """Play the steps as hypothesis would, checking the invariants after each, then let the
    faults clear and the mains come back for good and check the site returns."""
    with story() as machine:
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
            check_invariants(machine)
    return machine


@contextlib.contextmanager
def story() -> Iterator[PairMachine]:
    machine = PairMachine()
    try:
        yield machine
    finally:
        machine.teardown()


def check_invariants(machine: PairMachine) -> None:
    machine.every_request_kept_the_rules()
    machine.never_misses_a_shutdown()
    machine.journal_and_status_tell_the_same_story()


def step(name: str, **arguments: Any) -> Step:
    return name, arguments


def test_the_caches_a_stopped_leader_flipped_go_back_to_write_back() -> None:
    """A person's shutdown on mains flipped the cache to write-through on the leader, which
    was then stopped (SIGTERM); the other controller won the lease and finished the run,
    but the debt (which caches upsguard took out of write-back) is in the first one's
    journal only: back as the standby, it owes the cache and may not act; the leader does
    not know it owes it. The site came back with the cache in write-through for good. The
    debt is now in the shared ledger: each cache a leader flips or returns is written there,
    and whoever leads next owes what it holds."""
    replay(
        step("trigger", controller="ctl-a", direction="shutdown", only=[]),
        step("sigterm", controller="ctl-a"),
    )


def test_both_alone_when_the_store_comes_back_one_leads_and_the_other_stops_acting() -> None:
    """The store lost its quorum during an outage: both controllers went on alone, each with
    its own shutdown. When it answered again, both went on alone until their runs ended,
    acting side by side for more than a lease after the heal (and, their runs never
    recorded, the site did not come back). Alone for the store's silence (not because its
    machines were going down), a controller campaigns as soon as the store answers: one
    leads and records its run, the other stops acting and follows it."""
    replay(
        step("mains", on=False, ups="ua"),
        step("battery_older_than_its_model", charge=3, ups="ua"),
        step("mains", on=False, ups="ub"),
        step("store_quorum", lost=True),
        step("time_passes", seconds=120),
    )


def test_a_ledger_read_as_the_standby_is_not_followed_once_the_controller_leads() -> None:
    """A person's shutdown, then each controller stopped in turn: the controller that won
    the lease last held, until it took the run up, the store's ledger it had followed as the
    standby (the run interrupted, so in progress there) and not yet its journal's. The rule
    took that moment of a takeover for two stories; a controller taking over now says so
    (``Service.taking_over``), and a ledger read as the standby is no longer followed once
    the controller leads."""
    replay(
        step("trigger", controller="ctl-a", direction="shutdown", only=[]),
        step("sigterm", controller="ctl-a"),
        step("sigterm", controller="ctl-a"),
        step("sigterm", controller="ctl-a"),
        step("sigterm", controller="ctl-b"),
        step("sigterm", controller="ctl-a"),
    )


def test_a_cache_owed_by_a_controller_restarted_again_and_again_goes_back_to_write_back() -> None:
    """A person's shutdown flipped the cache on ctl-a, which was then stopped five times in
    a row, and ctl-b took the run over and returned the cache. The last ctl-a started as the
    standby with the journal's phase still "shutting down", and flipped the cache again
    itself: a standby acting, and a debt the leader had marked as taken, so ctl-a dropped
    it, and the site came back with the cache in write-through. A standby's restart now
    flips nothing; the leader keeps the caches."""
    replay(
        step("trigger", controller="ctl-a", direction="shutdown", only=[]),
        *[step("sigterm", controller="ctl-a") for _ in range(5)],
    )


def test_a_run_started_alone_and_killed_is_not_left_running_in_the_journal() -> None:
    """ctl-a leads and starts a startup while etcd has lost its quorum: the run's record
    never reaches the shared ledger. Killed, ctl-a restarts and wins the lease again; the
    store holds no run, and ctl-a's journal kept the startup in progress for good, a run no
    one would run or end (found by the pair machine). A run the journal left that the store
    never held is resumed now when nothing newer went on since, else closed as superseded."""
    replay(
        step("store_quorum", lost=True),
        step("trigger", controller="ctl-a", direction="startup", only=[]),
        step("store_quorum", lost=False),
        step("platform_hangs", platform="vc", seconds=30),
        step("pause", controller="ctl-b"),
        step("kill_9", controller="ctl-a"),
        step("mains", on=True, ups="ub"),
    )


def test_a_ups_told_by_a_leader_whose_term_then_ends_is_not_told_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller finishing the shutdown (alone: its machines carry the store) told UPS
    ua its load cycle, then stopped (SIGSTOP) before ub and its machine: its lease ran out,
    and the other controller took the run over and told ua a second time, since which UPS
    was told lived in the first one's memory. Now a leader marks each UPS in the shared
    ledger, fenced (finishing alone too, while the store answers), before it tells it, and
    the next one tells only the others. Behind it, two more: the world booted only the first
    controller's machine when the power came back (the other's firmware powers it on too),
    so the store never had its quorum again; and that controller, booted with its journal's
    phase ``shutting_down`` and its run closed on mains, started a shutdown of the site
    coming back before the mains had been there ``online_for``."""
    paused: list[str] = []
    command = LabUps.command
    with story() as machine:

        async def command_then_pause(ups: LabUps, name: str) -> None:
            await command(ups, name)
            if not paused:
                paused.append(ups.name)
                (seat,) = [
                    s for s in machine.lab.seats if s.process and s.process.life is ups._life
                ]
                machine.lab.pause(seat)  # SIGSTOP right after the UPS answered

        monkeypatch.setattr(LabUps, "command", command_then_pause)
        outage_until(machine, lambda: bool(paused))
        for ups in ("ua", "ub"):
            machine.fsd(ups=ups, on=False)
        machine.time_passes(seconds=60)  # the paused one's lease runs out; the other leads
        check_invariants(machine)
        told = [e.ups for _, _, e in machine.lab.events if isinstance(e, UpsCommandSent) and e.ok]
        assert sorted(told) == ["ua", "ub"], told


def test_a_run_whose_every_ups_was_told_is_not_resumed_when_the_machines_boot() -> None:
    """ctl-b finished the shutdown alone (the store's machines going down): it told both
    UPSes their load cycle and stopped both controllers' machines, its last marks dropped
    as made alone. The load cycle brought the power back; both machines booted, the store
    had its quorum again, and ctl-a resumed the run from the ledger: it stopped mgmt-b and
    its own machine again, with no load cycle left to bring them back (the ledger said both
    UPSes were told). A run whose only steps left stop the controllers' machines, and whose
    every UPS was told, ended with that load cycle: it is closed, not resumed."""
    replay(
        step("fsd", on=True, ups="ub"),
        step("mains", on=False, ups="ua"),
        step("time_passes", seconds=1),
        step("time_passes", seconds=1),
        step("self_test", on=True, ups="ub"),
        step("time_passes", seconds=1),
        step("time_passes", seconds=1),
        step("time_passes", seconds=900),
    )


def test_a_shutdown_started_the_instant_the_mains_fail_is_no_shutdown_on_mains() -> None:
    """Found by the pair machine's stories at length, and a defect of the lab's rule, not of
    the pair: the battery at 8% on mains, then the mains fail, and the critical floor
    starts the shutdown at that same virtual instant. The rule "no shutdown starts while
    its feeds are on mains" read the mains as its sampler had seen them a moment before
    (on mains for 15 minutes). It reads them as they are at the start now."""
    replay(
        step("time_passes", seconds=900),
        step("battery_older_than_its_model", charge=8, ups="ub"),
        step("mains", on=False, ups="ub"),
        step("time_passes", seconds=1),
    )


def test_a_forced_shutdown_then_the_quorum_lost_and_both_restarted_the_site_returns() -> None:
    """Found by the pair machine at 10,000 stories (not shrunk): FSD on ub and its mains
    off, vCenter hanging 5 minutes, ctl-a restarted twice and aborting all along, etcd's
    quorum lost, ub's mains back, ctl-a killed and ctl-b restarted. Kept as found. It failed
    with lab.Stuck: the controller that won the lease after the faults resumed the shutdown
    while its phase read normal, and the run's point of no return waited for good."""
    replay(
        step("abort", controller="ctl-a"),
        step("abort", controller="ctl-a"),
        step("fsd", on=True, ups="ub"),
        step("mains", on=False, ups="ub"),
        *[step("abort", controller="ctl-a")] * 6,
        step("platform_hangs", platform="vc", seconds=300),
        step("sigterm", controller="ctl-a"),
        *[step("abort", controller="ctl-a")] * 4,
        step("sigterm", controller="ctl-a"),
        *[step("abort", controller="ctl-a")] * 3,
        step("store_quorum", lost=True),
        *[step("abort", controller="ctl-a")] * 4,
        step("mains", on=True, ups="ub"),
        step("abort", controller="ctl-a"),
        step("kill_9", controller="ctl-a"),
        step("sigterm", controller="ctl-b"),
        step("time_passes", seconds=120),
    )


def test_a_drill_whose_end_was_lost_does_not_hold_the_site_in_recovering() -> None:
    """Found by the pair machine at 10,000 stories (shard 0, partly shrunk): a drill
    aborted while the leader's next write to the store was lost, so the store kept the drill
    in progress. A later startup ended done, yet the drill still read as running: both
    controllers stayed in recovering for good. Starting a run closes any other the ledger
    holds in progress (one run at a time), as taking the lease did already."""
    replay(
        *[step("abort", controller="ctl-a")] * 6,
        step("trigger", controller="ctl-a", direction="startup", only=[]),
        step("battery_older_than_its_model", charge=3, ups="ub"),
        step("platform_fault", fault="as configured", resource="db"),
        step("trigger", controller="ctl-a", direction="shutdown", only=["db"]),
        step("store_refuses", calls=1, controller="ctl-a", error="authentication"),
        *[step("abort", controller="ctl-b")] * 2,
        step("cut_from_a_ups", controller="ctl-a", cut=False, ups="ua"),
        step("cache_refuses_to_flip", refuse=False),
        step("platform_hangs", platform="vc", seconds=30),
        step("writes_lost", controller="ctl-a", writes=1),
        *[step("abort", controller="ctl-a")] * 4,
        step("mains", on=False, ups="ub"),
        *[step("abort", controller="ctl-a")] * 2,
        step("sigterm", controller="ctl-a"),
    )


def test_a_startup_whose_leader_paused_after_a_claim_does_not_hold_the_site_in_recovering() -> None:
    """Found by the pair machine at 10,000 stories (shard 1, partly shrunk): the leader
    paused after its next claim, a startup triggered on it, the other paused, ub's mains
    off, the other woken: the startup's end never reached the store, and after the site's
    return both controllers stayed in recovering, the old startup read as running."""
    refuses = [step("cache_refuses_to_flip", refuse=False)]
    contact = [step("contact", link=LinkState.OK, ups="ua")]
    replay(
        *refuses * 2,
        *contact,
        step("fsd", on=False, ups="ua"),
        *refuses,
        *contact,
        step("cache_refuses_to_flip", refuse=True),
        step("battery_older_than_its_model", charge=8, ups="ub"),
        *contact,
        step("pause_after_its_next_claim", controller="ctl-a"),
        *[step("cut_from_a_ups", controller="ctl-a", cut=False, ups="ua")] * 2,
        *[step("time_passes", seconds=1)] * 2,
        *refuses,
        step("trigger", controller="ctl-a", direction="startup", only=[]),
        *refuses * 2,
        step("pause", controller="ctl-b"),
        step("mains", on=False, ups="ub"),
        step("time_passes", seconds=15),
        step("wake", controller="ctl-b"),
        *refuses,
    )


def test_a_run_the_other_controller_finished_is_closed_in_the_journal_that_left_it() -> None:
    """Found by the pair machine at 10,000 stories (shard 1, shrunk by hand): the leader
    killed mid-shutdown and restarted, the other finished the run; once the first led
    again, its own journal still held the run running for good (the shared ledger held it
    ended, so it was neither resumed nor closed)."""
    replay(
        step("trigger", controller="ctl-a", direction="shutdown", only=["db"]),
        *[step("kill_9", controller="ctl-a")] * 3,
        step("time_passes", seconds=120),
        step("sigterm", controller="ctl-b"),
        *[step("kill_9", controller="ctl-a")] * 3,
        step("fsd", on=False, ups="ua"),
    )


def test_a_site_file_read_again_while_the_new_leader_takes_over_leaves_the_run_resumed() -> None:
    """Found by the pair machine at 10,000 stories (shard 1): the leader lost its lease with
    its abort's record not in the store; the other won it while its site file was being
    read again, and its take-over waited for the controller of the old file. That one led
    once swapped out and closed: it resumed the run on a closed runtime (the site came back
    with its cache in write-through), and, once a stopped controller started nothing, the
    new leader's ledger held a shutdown in progress that no one ran. A take-over now leads
    with the controller in force."""
    replay(
        step("platform_hangs", platform="vc", seconds=300),
        step("cut_from_a_ups", controller="ctl-a", cut=True, ups="ua"),
        step("trigger", controller="ctl-a", direction="shutdown", only=[]),
        step("time_passes", seconds=5),
        *[step("store_refuses", calls=1, controller="ctl-a", error="authentication")] * 2,
        step("store_refuses", calls=5, controller="ctl-a", error="leadership lost"),
        step("abort", controller="ctl-a"),
        step("site_file_read_again", controller="ctl-b", good=True),
    )
