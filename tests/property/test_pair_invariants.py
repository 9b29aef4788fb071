"""The pair's invariants (DESIGN.md, "Invariants", two controllers), checked by a state
machine over two real services on the virtual clock, sharing one world and one store.

Hypothesis plays any interleaving of what the engine's machine plays (the mains, the UPSes,
a person, the platforms and caches, kill -9, SIGTERM and SIGHUP, now of either controller)
and of what breaks a pair: one controller cut off from the store or from a UPS, the store
losing its quorum, a write lost, a call answered with an error etcd raises, a controller
paused between a claim and its action and woken later. After every step the engine's rules
and the pair's (``PairLab``) must hold; at the end the faults clear, the mains come back
for good, and the site must return to ``normal`` with everything up, both controllers
serving.
"""

from __future__ import annotations

import contextlib
import os
import unittest

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from tests.property.lab import Process
from tests.property.pair_lab import ERRORS, NAMES, PairLab
from tests.property.test_outage_invariants import RESOURCES, UPSES, WHO, OutageMachine
from upsguard.errors import RunBusy, UpsguardError
from upsguard.models import ResourceId, UpsName

CONTROLLERS = st.sampled_from(NAMES)


class PairMachine(OutageMachine):
    lab: PairLab

    def make_lab(self) -> PairLab:
        return PairLab(self.tmp)

    def alive(self) -> bool:
        """Either controller serves: a person's CLI reaches it."""
        return any(seat.serving is not None for seat in self.lab.seats)

    def reached(self, controller: str) -> Process | None:
        """The process a person's command to ``controller`` reaches: serving, and not paused
        (a stopped process answers nothing; the CLI would time out, changing nothing)."""
        if controller in self.lab.paused:
            return None
        return self.lab.seat(controller).serving

    # -- a person, at either controller -------------------------------------------------------

    @precondition(alive)
    @rule(controller=CONTROLLERS)
    def hold(self, controller: str) -> None:
        process = self.reached(controller)
        if process is not None:
            process.service.overrides.hold(WHO, "maintenance")

    @precondition(alive)
    @rule(controller=CONTROLLERS)
    def release(self, controller: str) -> None:
        process = self.reached(controller)
        if process is not None:
            process.service.overrides.release(WHO)

    @precondition(alive)
    @rule(
        controller=CONTROLLERS,
        direction=st.sampled_from(["shutdown", "startup"]),
        only=st.lists(st.sampled_from(RESOURCES), max_size=2, unique=True),
    )
    def trigger(self, controller: str, direction: str, only: list[ResourceId]) -> None:
        process = self.reached(controller)
        if process is None:
            return
        overrides = process.service.overrides
        with contextlib.suppress(UpsguardError):  # a run in progress: the CLI says so
            self.lab.run(overrides.trigger(WHO, direction, only, "drill"), process=process)

    @precondition(alive)
    @rule(controller=CONTROLLERS)
    def abort(self, controller: str) -> None:
        for _ in range(2):
            process = self.reached(controller)
            if process is None:
                return
            try:
                self.lab.run(process.service.overrides.abort(WHO, "stop it"), process=process)
            except RunBusy:
                continue
            return

    # -- the controllers ----------------------------------------------------------------------

    @precondition(alive)
    @rule(controller=CONTROLLERS, good=st.booleans())
    def site_file_read_again(self, controller: str, good: bool) -> None:
        process = self.reached(controller)
        if process is not None:
            self.lab.run(self.lab.reload(good, process.seat), process=process)

    @precondition(alive)
    @rule(controller=CONTROLLERS)
    def kill_9(self, controller: str) -> None:
        self.lab.run(self.lab.restart(killed=True, seat=self.lab.seat(controller)))

    @precondition(alive)
    @rule(controller=CONTROLLERS)
    def sigterm(self, controller: str) -> None:
        """A paused process does not stop on SIGTERM: systemd's stop times out and kills it."""
        killed = controller in self.lab.paused
        self.lab.run(self.lab.restart(killed=killed, seat=self.lab.seat(controller)))

    @rule(controller=CONTROLLERS)
    def pause(self, controller: str) -> None:
        """SIGSTOP, now."""
        self.lab.pause(self.lab.seat(controller))

    @rule(controller=CONTROLLERS)
    def pause_after_its_next_claim(self, controller: str) -> None:
        """SIGSTOP right after its next claim lands, before the step acts."""
        self.lab.faults.pause_after_claim.add(controller)

    @rule(controller=CONTROLLERS)
    def wake(self, controller: str) -> None:
        self.lab.wake(self.lab.seat(controller))

    # -- the store and the links ----------------------------------------------------------------

    @rule(controller=CONTROLLERS, cut=st.booleans())
    def cut_from_the_store(self, controller: str, cut: bool) -> None:
        if cut:
            self.lab.faults.cut.add(controller)
        else:
            self.lab.faults.cut.discard(controller)

    @rule(controller=CONTROLLERS, ups=st.sampled_from(UPSES), cut=st.booleans())
    def cut_from_a_ups(self, controller: str, ups: UpsName, cut: bool) -> None:
        links = self.lab.seat(controller).cut
        if cut:
            links.add(ups)
        else:
            links.discard(ups)

    @rule(lost=st.booleans())
    def store_quorum(self, lost: bool) -> None:
        self.lab.faults.quorum_lost = lost

    @rule(controller=CONTROLLERS, writes=st.sampled_from([1, 3]))
    def writes_lost(self, controller: str, writes: int) -> None:
        self.lab.faults.lost_writes[controller] = writes

    @rule(
        controller=CONTROLLERS,
        error=st.sampled_from(sorted(ERRORS)),
        calls=st.sampled_from([1, 5]),
    )
    def store_refuses(self, controller: str, error: str, calls: int) -> None:
        self.lab.faults.errors.setdefault(controller, []).extend([ERRORS[error]] * calls)


QUICK = settings(
    max_examples=50,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""The quick lane's share: a few dozen short stories (two services and a store per story)."""
STORIES_AT_LENGTH = 1_000
SHARDS = 2
EXPLORE = os.environ.get("UPSGUARD_EXPLORE") is not None
"""As the engine's shards: the same stories every run unless ``UPSGUARD_EXPLORE=1``."""


def test_the_pair_invariants_hold() -> None:
    machine: type[PairMachine] = type("PairMachineQuick", (PairMachine,), {})
    if not EXPLORE:
        machine = seed(999)(machine)
    run_state_machine_as_test(machine, settings=QUICK)


def at_length(shard: int) -> type[unittest.TestCase]:
    """One shard of the machine as hypothesis's own test case (its statistics reach
    ``--hypothesis-show-statistics``)."""
    machine: type[PairMachine] = type(f"PairMachineShard{shard}", (PairMachine,), {})
    if not EXPLORE:
        machine = seed(1000 + shard)(machine)
    case = machine.TestCase
    case.settings = settings(
        QUICK, max_examples=STORIES_AT_LENGTH // SHARDS, stateful_step_count=30
    )
    case = pytest.mark.timeout(1800)(case)
    return pytest.mark.slow(pytest.mark.at_length(case))


for _shard in range(SHARDS):
    globals()[f"TestThePairInvariantsHoldAtLength{_shard}"] = at_length(_shard)
