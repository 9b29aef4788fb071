"""The outage invariants (DESIGN.md, "Invariants"), checked by a state machine over the real
service on the virtual clock.

Hypothesis plays any interleaving of what happens in an outage: the mains of each UPS failing
and returning, a UPS out of contact or stale, a self-test, FSD, a battery that is older than
its model; a person holding, releasing, triggering and aborting; platforms refusing,
hanging, answering late, their reads failing or coming back unknown; caches getting dirty,
refusing to flip or not answering at all; the controller killed
(``kill -9``) or stopped and started again from its journal; and time passing. After every
step the rules that must hold in every outage are checked (``OutageLab`` checks each
request the moment a platform accepts it); at the end the mains come back for good and the
site must return to ``normal`` with everything up and every cache back in write-back.

A failing example is shrunk to a short story, printed as the steps hypothesis took.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import unittest
from pathlib import Path

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.property.lab import FAILING_READS, UNKNOWN_READS, OutageLab
from upsguard.errors import RunBusy, UpsguardError
from upsguard.models import CacheName, LinkState, PlatformName, ResourceId, UpsName
from upsguard.plugins.platforms.simulated import Behaviour, Hang

UPSES = [UpsName("ua"), UpsName("ub")]
RESOURCES = [ResourceId(r) for r in ("db", "app", "web", "lab1", "h1", "h2", "h3", "nas")]
"""What faults are injected into: everything the controller stops but its own machine."""
FAULTS = {
    "as configured": Behaviour(),
    "refuses to stop": Behaviour(fail="stop"),
    "refuses to start": Behaviour(fail="start"),
    "guest hangs": Behaviour(hang=True),
    "slow request": Behaviour(request_s=40.0),
    "slow to stop": Behaviour(stop_s=240.0),
}
WHO = "lab"
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None
"""Where each example's journal lives: in memory where the machine has it (thousands of
journals are written and thrown away)."""


class OutageMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="upsguard-lab-", dir=SCRATCH))
        self.lab = self.make_lab()

    def make_lab(self) -> OutageLab:
        return OutageLab(self.tmp)

    def teardown(self) -> None:
        try:
            if not self.lab.violations:  # an example that broke a rule has failed already
                left = self.lab.settle()
                assert not left, "after the mains came back for good:\n" + "\n".join(left)
        finally:
            self.lab.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def alive(self) -> bool:
        """Serving: a person's CLI reaches it."""
        return self.lab.serving is not None

    # -- the power ---------------------------------------------------------------------------

    @rule(ups=st.sampled_from(UPSES), on=st.booleans())
    def mains(self, ups: UpsName, on: bool) -> None:
        self.lab.change(lambda: self.lab.power.set_mains([ups], on))

    @rule(ups=st.sampled_from(UPSES), link=st.sampled_from(list(LinkState)))
    def contact(self, ups: UpsName, link: LinkState) -> None:
        self.lab.change(lambda: self.lab.power.set_link([ups], link))

    @rule(ups=st.sampled_from(UPSES), on=st.booleans())
    def self_test(self, ups: UpsName, on: bool) -> None:
        self.lab.change(lambda: self.lab.power.set_self_test([ups], on))

    @rule(ups=st.sampled_from(UPSES), on=st.booleans())
    def fsd(self, ups: UpsName, on: bool) -> None:
        self.lab.change(lambda: self.lab.power.set_fsd([ups], on))

    @rule(ups=st.sampled_from(UPSES), charge=st.sampled_from([60, 35, 15, 8, 3]))
    def battery_older_than_its_model(self, ups: UpsName, charge: int) -> None:
        battery = self.lab.power.batteries[ups]
        battery.soc = min(battery.soc, charge / 100)

    @rule(seconds=st.sampled_from([1, 5, 15, 30, 60, 120, 300, 900]))
    def time_passes(self, seconds: int) -> None:
        self.lab.wait(seconds)

    # -- a person ---------------------------------------------------------------------------

    @precondition(alive)
    @rule()
    def hold(self) -> None:
        assert self.lab.serving is not None
        self.lab.serving.service.overrides.hold(WHO, "maintenance")

    @precondition(alive)
    @rule()
    def release(self) -> None:
        assert self.lab.serving is not None
        self.lab.serving.service.overrides.release(WHO)

    @precondition(alive)
    @rule(
        direction=st.sampled_from(["shutdown", "startup"]),
        only=st.lists(st.sampled_from(RESOURCES), max_size=2, unique=True),
    )
    def trigger(self, direction: str, only: list[ResourceId]) -> None:
        assert self.lab.serving is not None
        overrides = self.lab.serving.service.overrides
        with contextlib.suppress(UpsguardError):  # a run in progress: the CLI says so
            self.lab.run(overrides.trigger(WHO, direction, only, "drill"))

    @precondition(alive)
    @rule()
    def abort(self) -> None:
        """A person's abort; one that waited behind a reload of the site file is refused
        ("ask again"), and the person asks again, of the controller now in force."""
        for _ in range(2):
            assert self.lab.serving is not None
            try:
                self.lab.run(self.lab.serving.service.overrides.abort(WHO, "stop it"))
            except RunBusy:
                continue
            return

    # -- faults -------------------------------------------------------------------------------

    @rule(resource=st.sampled_from(RESOURCES), fault=st.sampled_from(sorted(FAULTS)))
    def platform_fault(self, resource: ResourceId, fault: str) -> None:
        self.lab.behave(resource, FAULTS[fault])

    @rule(
        platform=st.sampled_from(["vc", "dev"]),
        seconds=st.sampled_from([None, 30, 300]),
    )
    def platform_hangs(self, platform: str, seconds: int | None) -> None:
        now = self.lab.now
        hang = Hang(now, now + seconds) if seconds is not None else None
        self.lab.platforms[platform].hang = hang  # type: ignore[index]

    @rule(nbytes=st.sampled_from([0, 64 << 20, 3 << 30]))
    def guests_write(self, nbytes: int) -> None:
        self.lab.caches[CacheName("flash")].inner.write(nbytes)

    @rule(refuse=st.booleans())
    def cache_refuses_to_flip(self, refuse: bool) -> None:
        self.lab.caches[CacheName("flash")].refuse = refuse

    @rule(unreadable=st.booleans())
    def cache_stops_answering(self, unreadable: bool) -> None:
        self.lab.caches[CacheName("flash")].unreadable = unreadable

    @rule(
        platform=st.sampled_from([PlatformName("vc"), PlatformName("dev")]),
        reads=st.sampled_from([None, UNKNOWN_READS, FAILING_READS]),
    )
    def platform_reads_go_wrong(self, platform: PlatformName, reads: str | None) -> None:
        """Its reads come back unknown (garbage) or fail, while its requests get through."""
        self.lab.set_reads(platform, reads)

    # -- the controller itself ----------------------------------------------------------------

    @precondition(alive)
    @rule(good=st.booleans())
    def site_file_read_again(self, good: bool) -> None:
        """SIGHUP: a good file (another margin) is taken in force, now or once the run in
        progress ends; one with a mistake changes nothing."""
        assert self.lab.serving is not None
        self.lab.run(self.lab.reload(good))

    @precondition(alive)
    @rule()
    def kill_9(self) -> None:
        self.lab.run(self.lab.restart(killed=True))

    @precondition(alive)
    @rule()
    def sigterm(self) -> None:
        self.lab.run(self.lab.restart(killed=False))

    # -- the invariants -----------------------------------------------------------------------

    @invariant()
    def every_request_kept_the_rules(self) -> None:
        assert not self.lab.violations, "\n".join(self.lab.violations)

    @invariant()
    def never_misses_a_shutdown(self) -> None:
        missed = self.lab.missed_shutdown()
        assert missed is None, missed

    @invariant()
    def journal_and_status_tell_the_same_story(self) -> None:
        differ = self.lab.story_differs()
        assert differ is None, differ


QUICK = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Set here rather than by the lanes' profiles: a few hundred stories in the quick lane (an
example takes a tenth of a second), 10,000 in the full one."""
STORIES_AT_LENGTH = 10_000
SHARDS = 8
"""The 10,000 stories are told in shards, each its own test, so that the workers of their stage
of ``scripts/test`` (one per core) share them."""
EXPLORE = os.environ.get("UPSGUARD_EXPLORE") is not None
"""The shards' stories are the same every run (each shard seeded by its number), so that CI
judges the change and not the draw; ``UPSGUARD_EXPLORE=1 scripts/test -m at_length``
draws new ones (the quick lane always does)."""


def test_the_outage_invariants_hold() -> None:
    run_state_machine_as_test(OutageMachine, settings=QUICK)


def at_length(shard: int) -> type[unittest.TestCase]:
    """Hypothesis's own test case of one shard of the machine, not ``run_state_machine_as_test``
    as above: only its test case brings the run's statistics to
    ``--hypothesis-show-statistics``."""
    machine: type[OutageMachine] = type(f"OutageMachineShard{shard}", (OutageMachine,), {})
    if not EXPLORE:
        machine = seed(shard)(machine)
    case = machine.TestCase
    case.settings = settings(QUICK, max_examples=STORIES_AT_LENGTH // SHARDS)
    case = pytest.mark.timeout(900)(case)  # generous: a loaded worker
    return pytest.mark.slow(pytest.mark.at_length(case))


for _shard in range(SHARDS):
    globals()[f"TestTheOutageInvariantsHoldAtLength{_shard}"] = at_length(_shard)
