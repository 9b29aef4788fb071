"""A deposed leader's fenced write fails and it does not act, on a real three-member etcd.

The leader's own clock check is taken out of the way on purpose (its monotonic clock stops,
as a controller's would look to itself after a pause it did not notice): it believes its
lease is fresh while the other controller has won a new term. What stops it is etcd's fence
alone: the claim of its next step is refused, the executor ends the run ``interrupted`` and
the platform is asked nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.peers.etcd import EtcdSite
from tests.runs import executor_for
from tests.sites import simple_site, site_from
from tests.unit.test_executor import FlakyPlatform
from upsguard.clock import LoopClock, SystemClock
from upsguard.config.ha import HaConfig
from upsguard.config.platforms import SimulatedPlatformSettings
from upsguard.engine.leadership import Leadership, Role
from upsguard.engine.pair import Pair
from upsguard.events import Event, StepFinished, StepStarted
from upsguard.models import PlatformName, ResourceId, StepState
from upsguard.plugins.coordination.base import Candidate
from upsguard.plugins.coordination.etcd import EtcdStore
from upsguard.plugins.platforms.simulated import Fleet
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunOutcome

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

TTL = 2.0
#: Only a hang reaches it: the other controller wins within the lease and a third more.
WITHIN = 20.0


class StoppableClock(SystemClock):
    """The system's clock until ``stop``: from then on its monotonic time stands still."""

    def __init__(self) -> None:
        self._stopped_at: float | None = None

    def stop(self) -> None:
        self._stopped_at = super().monotonic()

    def monotonic(self) -> float:
        return self._stopped_at if self._stopped_at is not None else super().monotonic()


def store_of(etcd: EtcdSite, name: str) -> EtcdStore:
    ha = HaConfig.model_validate(
        {
            "name": name,
            "endpoints": etcd.endpoints,
            "lease_ttl": f"{TTL:g}s",
            "fence_margin": "0.5s",
            "request_timeout": "1s",
        }
    )
    return EtcdStore(etcd.site, ha)


async def until(check: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(WITHIN):
        while not check():
            await asyncio.sleep(0.05)
    assert check(), what


def test_a_deposed_leaders_fenced_write_fails_and_it_does_not_act(
    etcd: EtcdSite, tmp_path: Path
) -> None:
    site = site_from(tmp_path, simple_site())

    async def scenario() -> None:
        stores = {name: store_of(etcd, name) for name in ("ctl-a", "ctl-b")}
        a_clock = StoppableClock()
        a = Leadership(
            stores["ctl-a"],
            Candidate("ctl-a", ResourceId("mgmt-a")),
            ttl_s=TTL,
            fence_margin_s=0.5,
            clock=a_clock,
        )
        b = Leadership(
            stores["ctl-b"],
            Candidate("ctl-b", ResourceId("mgmt-b")),
            ttl_s=TTL,
            fence_margin_s=0.5,
            clock=SystemClock(),
        )
        pair = Pair(a, stores["ctl-a"], a_clock, members=3)
        tasks: list[asyncio.Task[None]] = []

        def spawn(job: Awaitable[None]) -> asyncio.Task[None]:
            task = asyncio.ensure_future(job)
            tasks.append(task)
            return task

        events: list[Event] = []
        loop_clock = LoopClock(asyncio.get_running_loop(), datetime.now(UTC))
        fleet = Fleet()
        platforms: dict[PlatformName, FlakyPlatform] = {}
        for name in ("vc", "dev"):
            settings = site.platforms[name]
            assert isinstance(settings, SimulatedPlatformSettings)
            platforms[PlatformName(name)] = FlakyPlatform(
                PlatformName(name), settings, loop_clock, fleet
            )
        plan = Planner(site).plan("shutdown")
        executor = executor_for(
            plan,
            platforms,
            loop_clock,
            events.append,
            claim=lambda spec, step: pair.claim(spec, step.id, step.resource),
        )
        spec = executor.spec
        try:
            a_running = spawn(a.run())
            spawn(pair.write_in_order())
            await until(lambda: a.role is Role.LEADER, "ctl-a to win the lease")
            spawn(b.run())
            # while it leads, its claim is written, fenced by its term
            first = plan.steps[0]
            assert await pair.claim(spec, first.id, first.resource) is True
            marks = (await stores["ctl-b"].snapshot()).steps_of(spec.id)
            assert (marks[first.id].state, marks[first.id].by) == (StepState.RUNNING, "ctl-a")

            # ctl-a stops renewing, and its clock stands still: it still thinks it leads
            a_clock.stop()
            a_running.cancel()
            await until(lambda: b.role is Role.LEADER, "ctl-b to win once the lease ended")
            assert a.may_act()  # the clock check alone would let it act
            token_a, token_b = a.state().token, b.state().token
            assert token_a is not None and token_b is not None and token_b > token_a

            async with asyncio.timeout(WITHIN):
                result = await executor.run()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        after = await stores["ctl-b"].snapshot()
        for store in stores.values():
            await store.close()

        assert result.outcome is RunOutcome.INTERRUPTED
        assert platforms[PlatformName("vc")].stops == []  # the platform was asked nothing
        assert platforms[PlatformName("dev")].stops == []
        assert not [e for e in events if isinstance(e, StepStarted)]
        ended = {e.state for e in events if isinstance(e, StepFinished)}
        assert ended == {StepState.INTERRUPTED}
        assert a.role is Role.STANDBY  # the refusal ended its term
        # the store holds only what ctl-a wrote while it led
        assert set(after.steps_of(spec.id)) == {first.id}
        assert after.leader is not None and after.leader.holder.name == "ctl-b"

    asyncio.run(scenario())
