"""The executor on the virtual clock: order, parallelism limits, retries, fallbacks, cancel.

``FlakyPlatform`` wraps the shipped simulated platform to fail on purpose; it is a
test double of the ``Platform`` protocol, which the real plugins implement too.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.runs import executor_for, outcomes_by_step
from tests.sites import simple_site, site_from
from upsguard.clock import LoopClock, run_virtual
from upsguard.config.platforms import SimulatedPlatformSettings
from upsguard.config.resources import ResourceConfig
from upsguard.config.site import SiteConfig
from upsguard.engine.actions import UnderWay
from upsguard.engine.executor import RunResult
from upsguard.engine.slots import Slots
from upsguard.errors import PermanentError, PlatformUnreachable
from upsguard.events import Event, PointOfNoReturn, RunFinished, StepFinished, StepStarted
from upsguard.models import (
    CommandProcess,
    PlatformName,
    PowerState,
    ResourceId,
    RunId,
    StepState,
    StopMethod,
    Target,
)
from upsguard.plugins.platforms.base import (
    Platform,
    ProcessListener,
    SentListener,
    poll_for_state,
)
from upsguard.plugins.platforms.simulated import Behaviour, Fleet, SimulatedPlatform
from upsguard.plugins.platforms.simulated import Request as SimRequest
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunOutcome


class FlakyPlatform(SimulatedPlatform):
    """Refuses the first ``failures`` stop requests with a temporary error; counts concurrency."""

    def __init__(
        self,
        *args: Any,
        failures: int = 0,
        naming: bool = False,
        beaten: int = 0,
        **kwargs: Any,
    ) -> None:
        """``naming``: its errors name their target, as some SDKs' messages do. ``beaten``:
        the first stop requests find their target taken down by someone else just after
        it was read on, and are refused as vSphere refuses them (not powered on)."""
        super().__init__(*args, **kwargs)  # SimulatedPlatform's own arguments
        self.failures = failures
        self.naming = naming
        self.beaten = beaten
        self.stops: list[str] = []
        self.busy = 0
        self.most_busy = 0

    async def stop(self, target: Target, method: StopMethod) -> None:
        if self.beaten > 0:
            self.beaten -= 1
            self.fleet.state[target.name] = PowerState.OFF
            raise PermanentError(f"{target.name} is not powered on (InvalidState)")
        if self.failures > 0:
            self.failures -= 1
            named = f"{target.name}: " if self.naming else ""
            raise PlatformUnreachable(f"{named}vCenter did not answer", retry_after=5)
        self.stops.append(target.name)
        await super().stop(target, method)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            return await super().wait_for(target, state, timeout)
        finally:
            self.busy -= 1


def execute(
    site: SiteConfig,
    direction: str = "shutdown",
    failures: int = 0,
    cancel_after: float | None = None,
    naming: bool = False,
    behaviour: dict[ResourceId, Behaviour] | None = None,
    beaten: int = 0,
) -> tuple[RunResult, list[Event], FlakyPlatform]:
    events: list[Event] = []
    holder: dict[str, FlakyPlatform] = {}

    async def main() -> RunResult:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        fleet = Fleet(behaviour=behaviour)
        platforms: dict[PlatformName, FlakyPlatform] = {}
        for name in ("vc", "dev"):
            settings = site.platforms[name]
            assert isinstance(settings, SimulatedPlatformSettings)
            platforms[PlatformName(name)] = FlakyPlatform(
                PlatformName(name),
                settings,
                clock,
                fleet,
                failures=failures if name == "vc" else 0,
                naming=naming,
                beaten=beaten if name == "vc" else 0,
            )
        holder["vc"] = platforms[PlatformName("vc")]
        if direction == "startup":  # everything is off after an outage
            down = Planner(site).plan("shutdown")
            await executor_for(down, platforms, clock, lambda e: None).run()
        plan = Planner(site).plan(direction)
        executor = executor_for(plan, platforms, clock, events.append)
        task = asyncio.create_task(executor.run())
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return executor.result
        return await task

    result = run_virtual(main())
    return result, events, holder["vc"]


def test_steps_start_only_after_what_they_wait_for_finished(tmp_path: Path) -> None:
    result, events, _ = execute(site_from(tmp_path, simple_site()))
    assert result.outcome == "done"
    finished: set[str] = set()
    plan = Planner(site_from(tmp_path, simple_site())).plan("shutdown").by_id()
    for event in events:
        if isinstance(event, StepStarted):
            assert set(plan[event.step].waits_for) <= finished, event.step
        if isinstance(event, StepFinished):
            finished.add(event.step)
    assert finished == set(plan)


def test_parallelism_limit_is_respected(tmp_path: Path) -> None:
    data = simple_site()
    data["platforms"]["vc"]["max_parallel"] = 2
    _, _, vc = execute(site_from(tmp_path, data))
    assert vc.most_busy == 2


def test_temporary_errors_are_retried(tmp_path: Path) -> None:
    result, _, vc = execute(site_from(tmp_path, simple_site()), failures=2)
    assert result.outcome == "done"
    assert len(vc.stops) == 4 + 2 + 2  # web x4, app, db, h1, h2 all stopped in the end


def test_a_target_taken_down_between_the_read_and_the_request_is_done(tmp_path: Path) -> None:
    """The other controller of a pair going on alone (or a person) stops a target just
    after the step read it on: the platform refuses the request, and the step reads it
    again: off, what it wanted; the run is done, not failed."""
    result, _, vc = execute(site_from(tmp_path, simple_site()), beaten=2)
    assert result.outcome == "done"
    assert outcomes_by_step(result)["stop:web"].state is StepState.DONE
    assert sorted(vc.stops) == ["app", "db", "h1", "h2", "web-03", "web-04"]  # not asked again


@dataclass(frozen=True)
class Alone:
    """A controller of a pair going on without the store (``Unfenced``): its lag, and when
    it starts the run (the two are never quite in step: a journal, a last write). A lag of
    None: the controller that leads through the store (only the other is cut off)."""

    lag_s: float | None
    starts_s: float = 0.0

    def alone_lag_s(self) -> float | None:
        return self.lag_s

    def may_act(self) -> bool:
        return True  # alone: it acts


def simulated_platforms(
    site: SiteConfig, clock: LoopClock, fleet: Fleet
) -> dict[PlatformName, Platform]:
    """The site's two simulated platforms on one fleet: one controller's own connections."""
    platforms: dict[PlatformName, Platform] = {}
    for name in ("vc", "dev"):
        settings = site.platforms[name]
        assert isinstance(settings, SimulatedPlatformSettings)
        platforms[PlatformName(name)] = SimulatedPlatform(
            PlatformName(name), settings, clock, fleet
        )
    return platforms


STANDBY_LAG_S = 8.0
"""The former standby's lag in these tests (a default lease's silence limit, rounded up)."""


def shutdown_alone(
    site: SiteConfig, *controllers: Alone
) -> tuple[list[RunResult], dict[str, int], list[float]]:
    """The same shutdown run by each of ``controllers`` going on alone, against one vCenter
    (a shared fleet), each with platforms of its own as each has its own connection; a
    controller that lags was the standby, and resumes the run. Returns the runs' results,
    how often each target was asked, and when each request was made."""
    asked: dict[str, int] = {}
    when: list[float] = []

    async def main() -> list[RunResult]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        fleet = Fleet()

        def heard(request: SimRequest) -> None:
            asked[request.target.name] = asked.get(request.target.name, 0) + 1
            when.append(clock.monotonic())

        fleet.on_request = heard
        plan = Planner(site).plan("shutdown")

        async def run(alone: Alone) -> RunResult:
            platforms = simulated_platforms(site, clock, fleet)
            resumed = bool(alone.lag_s)
            executor = executor_for(
                plan, platforms, clock, lambda e: None, resumed=resumed, unfenced=alone
            )
            await asyncio.sleep(alone.starts_s)
            return await executor.run()

        return list(await asyncio.gather(*(run(alone) for alone in controllers)))

    results = run_virtual(main())
    return results, asked, when


@pytest.mark.parametrize("leader_behind_s", [0.0, 0.01, STANDBY_LAG_S + 2])
def test_two_controllers_alone_ask_each_target_once_the_former_standby_lagging(
    tmp_path: Path, leader_behind_s: float
) -> None:
    """Both controllers of a pair go on alone with the same shutdown (the store lost its
    quorum), the former leader in step with the other, a moment behind it, or further
    behind than the lag. Each reads the platform's requests under way before asking; the
    former standby lags each target, so a leader in step asks first. Whoever asks first,
    the other finds the request under way (or the target off) and waits for it: every
    target asked once, both runs done."""
    site = site_from(tmp_path, simple_site())
    leader, standby = Alone(0.0, starts_s=leader_behind_s), Alone(STANDBY_LAG_S)
    results, asked, _ = shutdown_alone(site, leader, standby)
    assert [r.outcome for r in results] == ["done", "done"]
    assert set(asked) == {"db", "app", "web-01", "web-02", "web-03", "web-04", "h1", "h2", "nas"}
    assert set(asked.values()) == {1}, asked


@pytest.mark.parametrize("leader_behind_s", [0.0, 0.01, 2.0])
def test_a_controller_cut_off_from_the_store_finds_what_the_leader_through_it_asked(
    tmp_path: Path, leader_behind_s: float
) -> None:
    """Only one controller is cut off from the store: it goes on alone, lagging each target
    (``Leadership.alone_lag_s``), while the other leads through the store with a new run of
    its own, reading no requests under way, in step or a moment behind. The leader asks
    each target first; the one alone finds the request under way or the target off: every
    target asked once."""
    site = site_from(tmp_path, simple_site())
    leader = Alone(None, starts_s=leader_behind_s)
    results, asked, _ = shutdown_alone(site, leader, Alone(STANDBY_LAG_S))
    assert [r.outcome for r in results] == ["done", "done"]
    assert len(asked) == 9 and set(asked.values()) == {1}, asked


def test_the_former_standby_alone_still_shuts_everything_down_only_later(
    tmp_path: Path,
) -> None:
    """The former leader is dead: the former standby, alone, asks every target itself, once,
    each a lag later than the leader would have (the cost of the rule)."""
    site = site_from(tmp_path, simple_site())
    _, _, leader_when = shutdown_alone(site, Alone(0.0))
    results, asked, when = shutdown_alone(site, Alone(STANDBY_LAG_S))
    assert results[0].outcome == "done"
    assert len(asked) == 9 and set(asked.values()) == {1}, asked
    assert when[0] == leader_when[0] + STANDBY_LAG_S


def test_exhausted_retries_fail_the_step_and_say_why(tmp_path: Path) -> None:
    data = simple_site()
    for res in data["resources"]:
        res["retries"] = 0
    result, _, _ = execute(site_from(tmp_path, data), failures=100)
    assert result.outcome == "failed"
    outcomes = outcomes_by_step(result)
    assert outcomes["stop:db"].state is StepState.FAILED
    assert outcomes["stop:db"].detail == "db: vCenter did not answer"
    # shutdown goes on after a failure (power is going anyway): the NAS still stops
    assert outcomes["stop:nas"].state is StepState.DONE


def test_an_error_that_names_its_target_is_not_named_twice(tmp_path: Path) -> None:
    data = simple_site()
    for res in data["resources"]:
        res["retries"] = 0
    result, _, _ = execute(site_from(tmp_path, data), failures=100, naming=True)
    assert outcomes_by_step(result)["stop:db"].detail == "db: vCenter did not answer"


def test_startup_does_not_start_dependents_of_a_failed_step(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    result, events, _ = execute(
        site, "startup", behaviour={ResourceId("h1"): Behaviour(fail="start")}
    )
    assert result.outcome == "failed"
    started = [e.step for e in events if isinstance(e, StepStarted)]
    assert started[0] == "start:nas"
    assert "start:db" not in started
    outcomes = outcomes_by_step(result)
    assert outcomes["start:db"].detail == "not started: start:h1 failed"
    assert outcomes["start:app"].state is StepState.SKIPPED
    assert outcomes["start:h2"].state is StepState.DONE


def test_point_of_no_return_is_the_first_hardware_step(tmp_path: Path) -> None:
    _, events, _ = execute(site_from(tmp_path, simple_site()))
    (ponr,) = [e for e in events if isinstance(e, PointOfNoReturn)]
    assert ponr.step in ("stop:h1", "stop:h2")


def test_cancel_marks_unfinished_steps(tmp_path: Path) -> None:
    result, _, _ = execute(site_from(tmp_path, simple_site()), cancel_after=50)
    states: dict[str, StepState] = {sid: o.state for sid, o in result.outcomes.items()}
    assert states["stop:web"] is StepState.DONE  # 40 s guest shutdowns
    assert states["stop:app"] is StepState.CANCELLED
    assert states["stop:nas"] is StepState.CANCELLED


def test_vsphere_without_tools_skip_leaves_the_vm_running(tmp_path: Path) -> None:
    """The platform setting applies only when there is no graceful path (no VMware Tools)."""
    data = {
        "site": "t",
        "ups": [{"name": "u", "simulated": {}}],
        "platforms": {
            "vc": {
                "type": "vsphere",
                "host": "vc.lab",
                "user": "u",
                "password_env": "X",
                "without_tools": "skip",
            },
        },
        "resources": [{"id": "db", "kind": "vm", "platform": "vc"}],
    }
    site = site_from(tmp_path, data)

    async def main() -> RunResult:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        no_tools = SimulatedPlatformSettings(type="simulated", tools_running=False)
        vc = SimulatedPlatform(PlatformName("vc"), no_tools, clock)
        plan = Planner(site).plan("shutdown")
        return await executor_for(plan, {PlatformName("vc"): vc}, clock, lambda e: None).run()

    outcome = outcomes_by_step(run_virtual(main()))["stop:db"]
    assert outcome.state is StepState.SKIPPED
    assert outcome.detail == "db: VMware Tools not running; left running"


def test_a_failing_event_sink_ends_the_run_failed_and_said_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """A bug under the executor (here an event sink that raises) ends the run ``failed``,
    with the error in its detail and the ledger told: never a run left running for ever."""
    site = site_from(tmp_path, simple_site())
    heard: list[Event] = []

    def sink(event: Event) -> None:
        heard.append(event)
        if isinstance(event, StepFinished) and event.step == "stop:app":
            raise OSError("journal: disk full")

    async def main() -> RunResult:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        fleet = Fleet()
        platforms = {
            PlatformName(n): SimulatedPlatform(PlatformName(n), s, clock, fleet)
            for n, s in site.platforms.items()
            if isinstance(s, SimulatedPlatformSettings)
        }
        plan = Planner(site).plan("shutdown")
        return await executor_for(plan, platforms, clock, sink).run()

    result = run_virtual(main())
    assert result.outcome is RunOutcome.FAILED
    ended = [e for e in heard if isinstance(e, RunFinished)]
    assert [(e.outcome, e.detail) for e in ended] == [
        (RunOutcome.FAILED, "internal error: OSError: journal: disk full")
    ]
    started = [e.step for e in heard if isinstance(e, StepStarted)]
    assert "stop:db" not in started  # what waits on the step the bug hit never starts


def test_platform_slots_go_first_come_first_served_and_a_cancelled_waiter_passes_its_turn() -> None:
    async def main() -> list[str]:
        slots = Slots(1)
        order: list[str] = []

        async def use(name: str, hold: float) -> None:
            async with slots:
                order.append(name)
                await asyncio.sleep(hold)

        first = asyncio.create_task(use("a", 10))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(use(n, 1)) for n in ("b", "c", "d")]
        await asyncio.sleep(1)
        waiting[0].cancel()  # b gives up before its turn
        await asyncio.gather(first, *waiting, return_exceptions=True)
        return order

    assert run_virtual(main()) == ["a", "c", "d"]


class HangingPlatform(SimulatedPlatform):
    """Never answers the first ``hangs`` state reads of the VM ``db``: a request that hangs."""

    def __init__(self, *args: Any, hangs: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # SimulatedPlatform's own arguments
        self.hangs = hangs
        self.reads = 0

    async def power_state(self, target: Target) -> PowerState:
        if target.name == "db":
            self.reads += 1
            if self.reads <= self.hangs:
                await asyncio.Event().wait()
        return await super().power_state(target)


def run_with_hangs(site: SiteConfig, hangs: int) -> tuple[RunResult, HangingPlatform]:
    async def main() -> tuple[RunResult, HangingPlatform]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        fleet = Fleet()
        platforms: dict[PlatformName, HangingPlatform] = {}
        for name, settings in site.platforms.items():
            assert isinstance(settings, SimulatedPlatformSettings)
            platforms[PlatformName(name)] = HangingPlatform(
                PlatformName(name), settings, clock, fleet, hangs=hangs if name == "vc" else 0
            )
        plan = Planner(site).plan("shutdown")
        executor = executor_for(plan, platforms, clock, lambda e: None)
        return await executor.run(), platforms[PlatformName("vc")]

    return run_virtual(main())


def test_a_request_that_hangs_is_abandoned_and_asked_again(tmp_path: Path) -> None:
    result, vc = run_with_hangs(site_from(tmp_path, simple_site()), hangs=1)
    assert vc.reads == 2
    assert result.outcome == "done"
    assert outcomes_by_step(result)["stop:db"].detail == "db shut down"


def test_a_platform_that_never_answers_fails_the_step_after_its_retries(tmp_path: Path) -> None:
    result, vc = run_with_hangs(site_from(tmp_path, simple_site()), hangs=100)
    assert vc.reads == 3  # the first request and two retries (retries: 2)
    outcomes = outcomes_by_step(result)
    assert (outcomes["stop:db"].state, outcomes["stop:db"].detail) == (
        StepState.FAILED,
        "db: no answer within 2m",
    )
    assert outcomes["stop:nas"].state is StepState.DONE


class TaskedPlatform(SimulatedPlatform):
    """Lists its requests as tasks, as vSphere and Proxmox do: a stop is under way until its
    target is off. ``unreadable`` makes the list fail to read."""

    def __init__(self, *args: Any, unreadable: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # SimulatedPlatform's own arguments
        self.unreadable = unreadable
        self.stops: list[str] = []
        self.looked: list[str] = []

    async def stop(self, target: Target, method: StopMethod) -> None:
        self.stops.append(target.name)
        await super().stop(target, method)

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        self.looked.append(target.name)
        if self.unreadable:
            raise PlatformUnreachable("the task list did not answer")
        on = await self.power_state(target) is PowerState.ON
        asked = target.name in self.stops
        return f"task-{target.name}" if state is PowerState.OFF and asked and on else None


def stop_after_a_restart(
    tmp_path: Path, resumed: bool, unreadable: bool = False
) -> tuple[StepState, str, TaskedPlatform]:
    """The controller that died asked db to shut down (40 s); then a run carries on."""
    site = site_from(
        tmp_path,
        {
            "site": "t",
            "ups": [{"name": "u", "simulated": {}}],
            "platforms": {"vc": {"type": "simulated", "guest_shutdown": "40s"}},
            "resources": [{"id": "db", "kind": "vm", "platform": "vc"}],
        },
    )

    async def main() -> tuple[StepState, str, TaskedPlatform]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        settings = site.platforms["vc"]
        assert isinstance(settings, SimulatedPlatformSettings)
        vc = TaskedPlatform(PlatformName("vc"), settings, clock, unreadable=unreadable)
        [db] = await vc.resolve(site.resources[0])
        await vc.stop(db, StopMethod.GRACEFUL)
        await asyncio.sleep(10)  # the restart
        plan = Planner(site).plan("shutdown")
        run = executor_for(plan, {PlatformName("vc"): vc}, clock, lambda e: None, resumed=resumed)
        outcome = (await run.run()).outcomes[plan.steps[0].id]
        return outcome.state, outcome.detail, vc

    return run_virtual(main())


def test_a_resumed_step_waits_for_its_task_under_way_instead_of_asking_again(
    tmp_path: Path,
) -> None:
    state, detail, vc = stop_after_a_restart(tmp_path, resumed=True)
    assert (state, vc.stops) == (StepState.DONE, ["db"])
    assert detail == "db shut down (waited for task-db, under way before the restart)"


def test_only_a_resumed_run_looks_for_tasks_under_way(tmp_path: Path) -> None:
    state, _, vc = stop_after_a_restart(tmp_path, resumed=False)
    assert (state, vc.looked, vc.stops) == (StepState.DONE, [], ["db", "db"])


def test_tasks_that_cannot_be_read_do_not_keep_a_resumed_step_from_asking(
    tmp_path: Path,
) -> None:
    state, detail, vc = stop_after_a_restart(tmp_path, resumed=True, unreadable=True)
    assert (state, vc.looked, vc.stops) == (StepState.DONE, ["db"], ["db", "db"])
    assert detail == "db shut down"


@dataclass
class Leading:
    """A leader of a pair (``Unfenced``), its steps fenced by the store: no lag, and a term
    that ends when the test says (its lease's fence passed with the store silent)."""

    term_holds: bool = True

    def alone_lag_s(self) -> float | None:
        return None

    def may_act(self) -> bool:
        return self.term_holds


def test_a_claim_does_not_outlive_the_term_each_request_is_fenced(tmp_path: Path) -> None:
    """etcd fenced the claim, not the act: a step claimed under a valid term waited for its
    platform's slot (``max_parallel: 1``) past the end of the term and then asked, while the
    other controller led. Each request now re-checks the term right before it is made: the
    step whose term ended is interrupted, asks nothing, and the run ends interrupted."""
    data = simple_site()
    data["platforms"]["vc"]["max_parallel"] = 1
    site = site_from(tmp_path, data)
    leader = Leading()
    asked: list[str] = []
    events: list[Event] = []

    async def main() -> RunResult:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        fleet = Fleet()

        def heard(request: SimRequest) -> None:
            asked.append(request.target.name)
            if request.target.name == "web-01":
                leader.term_holds = False  # the lease's fence passes while web-01 lands

        fleet.on_request = heard
        platforms = simulated_platforms(site, clock, fleet)
        plan = Planner(site).plan("shutdown")
        executor = executor_for(
            plan,
            platforms,
            clock,
            events.append,
            claim=lambda spec, step: _claimed(),
            unfenced=leader,
        )
        return await executor.run()

    result = run_virtual(main())
    assert asked[-1] == "web-01" and asked.count("web-01") == 1  # nothing asked after it
    assert result.outcome is RunOutcome.INTERRUPTED
    interrupted = [o for o in result.outcomes.values() if o.state is StepState.INTERRUPTED]
    assert interrupted, outcomes_by_step(result)
    assert any("term" in o.detail for o in interrupted), [o.detail for o in interrupted]


async def _claimed() -> bool:
    return True  # claimed while the term held


class SlowCommandPlatform:
    """A double of the ``command`` platform (``RunsProcesses``): a command runs ``command_s``
    seconds in a process of its own, which a cancelled request leaves running (as the real
    command's session outlives it), and the platform bounds it by its own ``timeout``. There
    is no ``status`` command: the state is what the last command that ended made it."""

    def __init__(self, clock: LoopClock, command_s: float, timeout_s: float) -> None:
        self.name = PlatformName("cmd")
        self.starts = 0
        self.state = PowerState.UNKNOWN
        self._clock = clock
        self._command_s = command_s
        self._timeout_s = timeout_s
        self._process: asyncio.Task[None] | None = None

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return [Target(self.name, resource.kind, resource.target_name, ref=str(resource.id))]

    async def power_state(self, target: Target) -> PowerState:
        return self.state

    async def stop(self, target: Target, method: StopMethod) -> None:
        raise AssertionError("a command step asks through request()")

    async def start(self, target: Target) -> None:
        raise AssertionError("a command step asks through request()")

    async def request(
        self, target: Target, wanted: PowerState, label: str, started: ProcessListener
    ) -> None:
        if self._process is None or self._process.done():
            self.starts += 1
            self._process = asyncio.create_task(self._command(wanted))
            pid = 4000 + self.starts
            started(CommandProcess(pid, 1, pid, f"/state/{label}.exit", self._clock.now()))
        async with asyncio.timeout(self._timeout_s):
            await asyncio.shield(self._process)

    async def _command(self, wanted: PowerState) -> None:
        await asyncio.sleep(self._command_s)
        self.state = wanted

    def adopt(self, target: Target, wanted: PowerState, process: CommandProcess) -> None:
        return None

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        if self._process is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self._process)
        return self.state is state

    async def healthy(self, target: Target) -> bool:
        return self.state is PowerState.ON


def run_slow_command(tmp_path: Path, retries: int) -> tuple[StepState, str, int]:
    """A shutdown command that takes 5 minutes, on a platform whose commands may take 10 and
    a step allowed 15: the step's state and detail, and how often the command started."""
    site = site_from(
        tmp_path,
        {
            "site": "t",
            "ups": [{"name": "u", "simulated": {}}],
            "platforms": {"cmd": {"type": "command", "timeout": "10m"}},
            "resources": [
                {
                    "id": "db1",
                    "kind": "storage",
                    "platform": "cmd",
                    "shutdown": "quiesce-db",
                    "guest_timeout": "15m",
                    "retries": retries,
                }
            ],
        },
    )

    async def main() -> tuple[StepState, str, int]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        cmd = SlowCommandPlatform(clock, command_s=300, timeout_s=600)
        plan = Planner(site).plan("shutdown")
        run = executor_for(plan, {cmd.name: cmd}, clock, lambda e: None)
        outcome = (await run.run()).outcomes[plan.steps[0].id]
        return outcome.state, outcome.detail, cmd.starts

    return run_virtual(main())


@pytest.mark.parametrize("retries", [0, 2])
def test_a_command_step_is_bounded_by_its_own_timeouts_not_cut_at_two_minutes(
    tmp_path: Path, retries: int
) -> None:
    assert run_slow_command(tmp_path, retries) == (StepState.DONE, "db1 shut down", 1)


class SentCommandPlatform:
    """A double of the ssh platform (``SendsCommands``): a shutdown command takes the device
    down ``command_s`` after it is sent; nothing here can see it once sent."""

    def __init__(self, clock: LoopClock, command_s: float) -> None:
        self.name = PlatformName("dev")
        self.sent_at: list[float] = []
        self.down_at: float | None = None
        self.refuses = False
        self._clock = clock
        self._command_s = command_s

    def reaches_the_device(self, after_s: float) -> None:
        """A command sent before the restart that took the device down ``after_s`` from now."""
        self.down_at = self._clock.monotonic() + after_s

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return [Target(self.name, resource.kind, resource.target_name, ref=str(resource.id))]

    async def power_state(self, target: Target) -> PowerState:
        down = self.down_at is not None and self._clock.monotonic() >= self.down_at
        return PowerState.OFF if down else PowerState.ON

    async def stop(self, target: Target, method: StopMethod) -> None:
        if method is StopMethod.HARD:
            raise PermanentError(f"{target.name}: SSH has no hard power-off")
        await self.send_command(target, PowerState.OFF, lambda: None, request="")

    async def start(self, target: Target) -> None:
        raise AssertionError("only shutdowns here")

    async def send_command(
        self, target: Target, wanted: PowerState, sent: SentListener, *, request: str
    ) -> None:
        sent()
        if self.refuses:
            raise PermanentError(f"{target.name}: shutdown command exited 4: volume resync")
        now = self._clock.monotonic()
        self.sent_at.append(now)
        lands = now + self._command_s
        self.down_at = lands if self.down_at is None else min(self.down_at, lands)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        return await poll_for_state(self, target, state, timeout, 1.0, self._clock)

    async def healthy(self, target: Target) -> bool:
        return await self.power_state(target) is PowerState.ON


def resume_with_a_command_sent(
    tmp_path: Path, sent_s_before: float, reached_after_s: float | None
) -> tuple[StepState, str, list[float]]:
    """The controller that died sent nas1 its shutdown ``sent_s_before`` seconds before this
    resumed run (step timeout 60 s, journaled); the command took the device down
    ``reached_after_s`` into the run, or never reached it (None). The step's state and
    detail, and when (seconds into the run) commands were sent again."""
    site = site_from(
        tmp_path,
        {
            "site": "t",
            "ups": [{"name": "u", "simulated": {}}],
            "platforms": {"dev": {"type": "ssh"}},
            "resources": [
                {
                    "id": "nas1",
                    "kind": "storage",
                    "platform": "dev",
                    "shutdown": "poweroff",
                    "guest_timeout": "60s",
                }
            ],
        },
    )

    async def main() -> tuple[StepState, str, list[float]]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        dev = SentCommandPlatform(clock, command_s=5)
        if reached_after_s is not None:
            dev.reaches_the_device(reached_after_s)
        plan = Planner(site).plan("shutdown")
        [target] = await dev.resolve(site.resources[0])
        sent = clock.now() - timedelta(seconds=sent_s_before)
        earlier = UnderWay(
            RunId("r0"), plan.steps[0].id, target, PowerState.OFF, before_restart=True, at=sent
        )
        run = executor_for(
            plan,
            {dev.name: dev},
            clock,
            lambda e: None,
            resumed=True,
            under_way={earlier.key: earlier},
        )
        outcome = (await run.run()).outcomes[plan.steps[0].id]
        return outcome.state, outcome.detail, dev.sent_at

    return run_virtual(main())


def test_a_command_sent_before_the_restart_is_waited_for_not_sent_again(tmp_path: Path) -> None:
    state, detail, sent = resume_with_a_command_sent(tmp_path, 10, reached_after_s=20)
    since = (datetime(2026, 1, 1, tzinfo=UTC) - timedelta(seconds=10)).astimezone()
    landed = (
        "nas1 shut down (waited for the shutdown asked by run r0 "
        f"(since {since:%H:%M:%S}, before the restart))"
    )
    assert (state, detail, sent) == (StepState.DONE, landed, [])


def test_a_command_sent_before_the_restart_is_sent_again_only_after_the_step_timeout(
    tmp_path: Path,
) -> None:
    state, detail, sent = resume_with_a_command_sent(tmp_path, 10, reached_after_s=None)
    assert (state, detail, sent) == (StepState.DONE, "nas1 shut down", [50.0])


def test_a_command_sent_longer_ago_than_the_step_timeout_is_sent_again_at_once(
    tmp_path: Path,
) -> None:
    state, _, sent = resume_with_a_command_sent(tmp_path, 90, reached_after_s=None)
    assert (state, sent) == (StepState.DONE, [0.0])


def test_a_command_that_ran_and_failed_is_not_left_under_way(tmp_path: Path) -> None:
    """Journaled as it went out, but it exited non-zero: the next run asks again."""
    site = site_from(
        tmp_path,
        {
            "site": "t",
            "ups": [{"name": "u", "simulated": {}}],
            "platforms": {"dev": {"type": "ssh"}},
            "resources": [
                {"id": "nas1", "kind": "storage", "platform": "dev", "shutdown": "poweroff"}
            ],
        },
    )

    async def main() -> tuple[StepState, str, int]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        dev = SentCommandPlatform(clock, command_s=5)
        dev.refuses = True
        plan = Planner(site).plan("shutdown")
        run = executor_for(plan, {dev.name: dev}, clock, lambda e: None)
        outcome = (await run.run()).outcomes[plan.steps[0].id]
        return outcome.state, outcome.detail, len(run.under_way)

    assert run_virtual(main()) == (
        StepState.FAILED,
        "nas1: shutdown command exited 4: volume resync",
        0,
    )
