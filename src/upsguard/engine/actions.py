"""What one step does to each of its targets: check, act, wait, fall back, retry.

Every step is idempotent: it reads the target's state first (a VM already off is done),
so a step that a crash interrupted can run again safely. Nor does it ask twice: each
request a platform accepted is *under way* (``UnderWay``) until the target is seen in the
state it asked for, and a step that finds its target's request under way (from a run that
was cancelled, aborted or superseded, or journaled before a restart) waits for it instead
of asking again. In a resumed run it also asks a platform that lists its tasks
(``InFlightTasks``) whether a request is still under way (a host shutting down still reads
on). A command sent to the target itself (``SendsCommands``: ssh) cannot be seen once sent:
it is journaled as it goes out, and a resumed run sends no second one before the step's own
timeout has passed since the first; by then, not landed, it is sent again. A step whose
target has the opposite request under way lets it land first: a startup would find a VM up
that goes off a moment later, and a shutdown a host off that boots.

A controller of a pair going on without the store (``Unfenced``) has nothing between it and
the other to say who asks: it then reads the platform's requests under way before asking,
as a resumed run does, and lags each target by a fixed time first, the longer the later it
went alone (a leader through the store has none), so that the other, if alive, asks first
and this one finds its request under way (or the target off) instead of asking again; with
the other dead, this one still asks everything, later by the lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from upsguard.clock import Clock
from upsguard.config.resources import Fallback
from upsguard.config.types import format_duration
from upsguard.engine.health import wait_healthy
from upsguard.engine.retry import CALL_TIMEOUT_S, ask
from upsguard.engine.slots import Slots
from upsguard.errors import (
    GracefulUnavailable,
    LeadershipLost,
    PermanentError,
    StepTimeout,
    UpsguardError,
    naming,
)
from upsguard.models import (
    CommandProcess,
    Direction,
    PlatformName,
    PowerState,
    ResourceKind,
    RunId,
    StepId,
    StepOutcome,
    StepState,
    StopMethod,
    Target,
)
from upsguard.plugins.platforms.base import (
    InFlightTasks,
    Platform,
    RunsProcesses,
    SeenWhileItAnswers,
    SendsCommands,
)
from upsguard.runbooks.plan import Step, StepSettings

log = logging.getLogger(__name__)

HARD_OFF_WAIT_S = 60.0


TargetKey = tuple[PlatformName, str]
"""A target as its platform names it, whatever its other fields (a direct path, its host)."""


@dataclass(frozen=True, slots=True)
class UnderWay:
    """A request a platform accepted whose target has not been seen in the state it asked
    for yet: it may still land, so it is waited for, never asked again."""

    run: RunId
    step: StepId
    target: Target
    wanted: PowerState
    before_restart: bool = False
    """Asked by a controller before this one (from the journal)."""
    process: CommandProcess | None = None
    """The request is a command running here (``RunsProcesses``): its process, which a
    restarted controller waits for instead of starting the command again."""
    at: datetime | None = None
    """When it was asked (journaled): a command sent to the target (``SendsCommands``) is
    not sent again before the step's timeout has passed since."""

    @property
    def guest_shutdown(self) -> bool:
        return self.target.kind is ResourceKind.VM and self.wanted is PowerState.OFF

    @property
    def key(self) -> TargetKey:
        return key_of(self.target)

    def said(self) -> str:
        verb = "power-on" if self.wanted is PowerState.ON else "shutdown"
        if self.process is not None:
            return f"the {verb} command of run {self.run} (pid {self.process.pid})"
        if self.before_restart and self.at is not None:
            since = self.at.astimezone().strftime("%H:%M:%S")
            return f"the {verb} asked by run {self.run} (since {since}, before the restart)"
        return f"the {verb} asked by run {self.run}"


def key_of(target: Target) -> TargetKey:
    return (target.platform, target.name)


RequestListener = Callable[[UnderWay], None]


class Unfenced(Protocol):
    """A controller of a pair, which may go on without the store (``engine.pair``)."""

    def may_act(self) -> bool:
        """Whether this controller may act now: it leads within its lease's fence, or goes
        on alone. A claim fences the decision to start a step; this, read right before each
        request to a platform, fences the act (a claim must not outlive its term)."""
        ...

    def alone_lag_s(self) -> float | None:
        """None while the store fences this controller's steps (nobody else acts on the
        targets). Without the store, how long each target waits before the step reads it to
        ask it: longer for the controller that went alone later, so that the other, if
        alive, has always asked before it reads (``Leadership.alone_lag_s``)."""
        ...


@dataclass(frozen=True, slots=True)
class Request:
    """What a step found before it waits: nothing to ask (already there), a request made
    now, or a request already under way (waited for, not repeated)."""

    needed: bool = True
    under_way: str | None = None

    def said(self) -> str:
        """The words the step's detail adds."""
        if self.under_way is None:
            return ""
        return f" (waited for {self.under_way})"


ALREADY_THERE = Request(needed=False)


def _landed_before(landed: str, already: str, sent_before: str | None) -> str:
    """A target found in the state its step wants: ``already`` so, or ``landed`` there by
    ``sent_before``, the command a controller before the restart sent, which it waited for."""
    return already if sent_before is None else f"{landed} (waited for {sent_before})"


@dataclass(frozen=True, slots=True)
class TargetResult:
    target: Target
    state: StepState
    detail: str
    attempts: int = 1
    fallback_used: bool = False
    already_there: bool = False


class StepRunner:
    """Carries out one step on each of its targets, from what the step carries: the executor
    gives it the platforms and the slots, and nothing of the site file."""

    def __init__(
        self,
        platforms: Mapping[PlatformName, Platform],
        clock: Clock,
        direction: Direction,
        slots: Mapping[PlatformName, Slots],
        network_probes: bool = True,
        resumed: bool = False,
        *,
        run: RunId,
        under_way: Mapping[TargetKey, UnderWay] | None = None,
        on_request: RequestListener | None = None,
        on_failed: RequestListener | None = None,
        on_wait: Callable[[StepId, str], None] | None = None,
        unfenced: Unfenced | None = None,
    ) -> None:
        """``network_probes``: False in a dry run (health checks ask the platform only).
        ``resumed``: the run was cut short before; tasks still under way are waited for.
        ``under_way``: requests accepted before this run and not seen to land (waited for).
        ``on_request``: hears each request a platform accepts (the journal keeps it).
        ``on_failed``: hears each command sent that ran and failed (no longer under way).
        ``on_wait``: hears a step waiting for a request of a run before it to land.
        ``unfenced``: this controller's side of a pair, which may go on without the store."""
        self._network_probes = network_probes
        self._resumed = resumed
        self._platforms = platforms
        self._clock = clock
        self._direction = direction
        self._slots = slots
        self._run = run
        self.under_way: dict[TargetKey, UnderWay] = dict(under_way or {})
        """Requests accepted and not seen to land, this run's and those it took over."""
        self._on_request = on_request
        self._on_failed = on_failed
        self._on_wait = on_wait
        self._unfenced = unfenced

    async def run(self, step: Step, started: datetime) -> StepOutcome:
        settings = step.settings
        assert settings is not None, "barriers are passed by the executor, not run"
        try:
            platform = self._platform(step.platform)
            targets = list(step.targets) or await ask(
                lambda: platform.resolve(settings.resource, direct=step.direct), settings.retries
            )
            if len(targets) == 1:  # most steps: no task of its own needed
                results = [await self._one(step, settings, platform, targets[0])]
            else:
                results = await asyncio.gather(
                    *(self._one(step, settings, platform, t) for t in targets)
                )
        except UpsguardError as exc:
            return StepOutcome(step.id, StepState.FAILED, started, self._clock.now(), str(exc))
        return _combine(step, list(results), started, self._clock.now())

    def _platform(self, name: str | None) -> Platform:
        if name is None or PlatformName(name) not in self._platforms:
            raise PermanentError(f"no platform '{name}' is open for this run")
        return self._platforms[PlatformName(name)]

    async def _one(
        self, step: Step, settings: StepSettings, platform: Platform, target: Target
    ) -> TargetResult:
        slot = self._slots.get(PlatformName(step.platform or ""))
        self._hand_back(platform, target)
        try:
            async with slot or contextlib.nullcontext():
                if self._direction is Direction.SHUTDOWN:
                    await self._lag()
                    return await self._stop(step.id, settings, platform, target)
                return await self._start(step.id, settings, platform, target)
        except LeadershipLost as exc:  # the term ended before it asked: neither failed nor done
            return TargetResult(target, StepState.INTERRUPTED, naming(target.name, exc))
        except UpsguardError as exc:
            return TargetResult(target, StepState.FAILED, naming(target.name, exc))
        except Exception as exc:  # a plugin bug must not stop the other steps at 3 a.m.
            log.exception("step %s on %s failed unexpectedly", step.id, target.name)
            return TargetResult(target, StepState.FAILED, f"{target.name}: internal error: {exc!r}")

    async def _stop(
        self, step: StepId, settings: StepSettings, platform: Platform, target: Target
    ) -> TargetResult:
        grace = settings.timeout_s
        await self._let_land(step, platform, target, PowerState.ON, grace)
        sent = await self._outwait_sent(step, platform, target, PowerState.OFF, grace)
        try:
            asked = await ask(
                lambda: self._ask_to_stop(step, platform, target),
                settings.retries,
                _allowance_s(platform, settings),
            )
            if not asked.needed:
                detail = f"{target.name} {_landed_before('shut down', 'already off', sent)}"
                return TargetResult(target, StepState.DONE, detail, already_there=True)
            if await self._landed(platform, target, PowerState.OFF, grace):
                detail = f"{target.name} shut down{asked.said()}"
                return TargetResult(target, StepState.DONE, detail)
            why = f"still on after {format_duration(grace)}{asked.said()}"
        except GracefulUnavailable as exc:
            fallback = settings.fallback_without_graceful
            return await self._fallback(step, settings, platform, target, str(exc), fallback)
        return await self._fallback(step, settings, platform, target, why, settings.fallback)

    async def _fallback(
        self,
        step: StepId,
        settings: StepSettings,
        platform: Platform,
        target: Target,
        why: str,
        fallback: Fallback,
    ) -> TargetResult:
        why = why if why.startswith(f"{target.name}:") else f"{target.name}: {why}"
        if fallback == "skip":
            self.under_way.pop(key_of(target), None)  # given up on: no longer waited for
            log.warning("%s; left running (fallback: skip)", why)
            return TargetResult(target, StepState.SKIPPED, f"{why}; left running")
        if fallback == "fail":
            self.under_way.pop(key_of(target), None)
            return TargetResult(target, StepState.FAILED, why)
        hard = functools.partial(platform.stop, target, StopMethod.HARD)
        await ask(lambda: self._fenced(hard), settings.retries)
        self._asked(step, target, PowerState.OFF)
        if await self._landed(platform, target, PowerState.OFF, HARD_OFF_WAIT_S):
            detail = f"{why}; powered off"
            return TargetResult(target, StepState.DONE, detail, fallback_used=True)
        return TargetResult(target, StepState.FAILED, f"{why}; power-off failed")

    async def _start(
        self, step: StepId, settings: StepSettings, platform: Platform, target: Target
    ) -> TargetResult:
        timeout = settings.timeout_s
        await self._let_land(step, platform, target, PowerState.OFF, timeout)
        sent = await self._outwait_sent(step, platform, target, PowerState.ON, timeout)
        state = await ask(lambda: platform.power_state(target), settings.retries)
        asked = ALREADY_THERE
        if state is not PowerState.ON:
            found = await self._found(platform, target, PowerState.ON)
            if found is None:
                await self._power_on(step, settings, platform, target)
            asked = Request(under_way=found)
            if not await self._landed(platform, target, PowerState.ON, timeout):
                return TargetResult(
                    target,
                    StepState.FAILED,
                    f"{target.name} not on after {format_duration(timeout)}",
                )
        try:
            await wait_healthy(
                settings.resource, target, platform, self._clock, self._network_probes
            )
        except StepTimeout as exc:
            return TargetResult(target, StepState.FAILED, str(exc))
        already = state is PowerState.ON
        done = _landed_before("up", "already up", sent) if already else "up"
        detail = f"{target.name} {done}{asked.said()}"
        return TargetResult(target, StepState.DONE, detail, already_there=already)

    async def _ask_to_stop(self, step: StepId, platform: Platform, target: Target) -> Request:
        """Read the state, then ask for a graceful stop unless its request is under way
        already: one request allowance covers them, and a retry reads the state again. Only
        a target read off is already off: one that could not be read is asked."""
        earlier = self.under_way.get(key_of(target))
        if (
            earlier is not None
            and earlier.wanted is PowerState.OFF
            and isinstance(platform, SeenWhileItAnswers)
        ):
            platform.shutdown_accepted(target)  # its going quiet is that shutdown landing
        if await platform.power_state(target) is PowerState.OFF:
            self._reached(target, PowerState.OFF)
            return ALREADY_THERE
        under_way = await self._found(platform, target, PowerState.OFF)
        if under_way is None:
            try:
                await self._request(step, platform, target, PowerState.OFF)
            except UpsguardError:
                if await platform.power_state(target) is not PowerState.OFF:
                    raise
                # it went down between the read and the request (the other controller of a
                # pair going on alone, a person): what the step wanted, not a failure
                self._reached(target, PowerState.OFF)
                return ALREADY_THERE
        return Request(under_way=under_way)

    def _hand_back(self, platform: Platform, target: Target) -> None:
        """A command process journaled before the restart for ``target`` goes back to its
        platform, which waits for it rather than start the command again."""
        earlier = self.under_way.get(key_of(target))
        if earlier is None or earlier.process is None or not earlier.before_restart:
            return
        if isinstance(platform, RunsProcesses):
            platform.adopt(target, earlier.wanted, earlier.process)

    async def _request(
        self, step: StepId, platform: Platform, target: Target, wanted: PowerState
    ) -> None:
        """Ask for a graceful stop (``OFF``) or a power-on (``ON``), fenced, and journal it as
        under way. A command run here is journaled as it starts, with its process: if this
        controller dies while it runs, the next one finds it (``RunsProcesses``)."""
        self._fence()
        if isinstance(platform, RunsProcesses):

            def started(process: CommandProcess) -> None:
                self._asked(step, target, wanted, process)

            await platform.request(target, wanted, f"{self._run}.{step}", started)
            return
        if isinstance(platform, SendsCommands):
            try:
                sent = functools.partial(self._asked, step, target, wanted)
                await platform.send_command(target, wanted, sent, request=f"{self._run}.{step}")
            except PermanentError:  # the command ran and failed: nothing is under way
                sent_now = self.under_way.get(key_of(target))
                if sent_now is not None and (sent_now.run, sent_now.step) == (self._run, step):
                    del self.under_way[key_of(target)]
                    if self._on_failed is not None:
                        self._on_failed(sent_now)
                raise
            return
        if wanted is PowerState.OFF:
            await platform.stop(target, StopMethod.GRACEFUL)
        else:
            await platform.start(target)
        self._asked(step, target, wanted)

    def _fence(self) -> None:
        """Right before a request: a controller of a pair whose term ended meanwhile (a
        slot, a retry, a fallback waited past its lease's fence) asks nothing."""
        if self._unfenced is not None and not self._unfenced.may_act():
            raise LeadershipLost("not asked: this controller's term ended before the request")

    async def _fenced(self, request: Callable[[], Awaitable[None]]) -> None:
        """``request()``, made only while the term still holds (see ``_fence``)."""
        self._fence()
        await request()

    def _alone_lag_s(self) -> float | None:
        return None if self._unfenced is None else self._unfenced.alone_lag_s()

    async def _lag(self) -> None:
        """Without the store, this controller lets the other ask first (``Unfenced``).
        Waited inside the platform's slot: a target whose slot both controllers get at once
        (the same request landed for both) is still read by this one a lag later."""
        lag = self._alone_lag_s()
        if lag:
            await asyncio.sleep(lag)

    def _asked(
        self,
        step: StepId,
        target: Target,
        wanted: PowerState,
        process: CommandProcess | None = None,
    ) -> None:
        """A platform accepted a request: it is under way until seen to land."""
        request = UnderWay(self._run, step, target, wanted, process=process, at=self._clock.now())
        self.under_way[request.key] = request
        if self._on_request is not None:
            self._on_request(request)

    async def _landed(
        self, platform: Platform, target: Target, wanted: PowerState, timeout: float
    ) -> bool:
        """Wait for the target to reach ``wanted``; once it has, its request has landed."""
        reached = await platform.wait_for(target, wanted, timeout)
        if reached:
            self._reached(target, wanted)
        return reached

    def _reached(self, target: Target, state: PowerState) -> None:
        """The target is in ``state``: a request for it has landed (one for the other state
        may still be on its way, and stays waited for)."""
        earlier = self.under_way.get(key_of(target))
        if earlier is not None and earlier.wanted is state:
            del self.under_way[key_of(target)]

    async def _found(self, platform: Platform, target: Target, wanted: PowerState) -> str | None:
        """A request for ``wanted`` under way already: one this controller asked (in this run
        or one before it), one journaled before a restart, or one the platform lists in a
        resumed run."""
        earlier = self.under_way.get(key_of(target))
        if earlier is None or earlier.wanted is not wanted:
            return await self._under_way(platform, target, wanted)
        if not earlier.before_restart:
            return earlier.said()
        if earlier.guest_shutdown:
            # asked again: harmless, and waiting for one that was lost would cost battery
            return await self._under_way(platform, target, wanted)
        listed = await self._listed(platform, target, wanted)
        if listed is False:  # the platform lists nothing: it landed, or the power undid it
            self.under_way.pop(key_of(target), None)
            return None
        return earlier.said() if listed is None else f"{listed}, under way before the restart"

    async def _let_land(
        self, step: StepId, platform: Platform, target: Target, state: PowerState, timeout: float
    ) -> None:
        """A step whose target has a request for ``state`` under way (the other way: its run
        was cancelled) lets it land first: a shutdown asked for cannot be taken back, nor can
        a power-on (a host booting is shut down once it is up, not called off). A platform
        that lists its tasks may say it is no longer under way (a guest that ignored it)."""
        earlier = self.under_way.get(key_of(target))
        if earlier is None or earlier.wanted is not state:
            return
        if await self._listed(platform, target, state) is not False:  # or cannot tell
            if self._on_wait is not None:
                self._on_wait(step, f"letting {earlier.said()} land first ({target.name})")
            await platform.wait_for(target, state, timeout)
        self.under_way.pop(key_of(target), None)

    async def _outwait_sent(
        self, step: StepId, platform: Platform, target: Target, state: PowerState, timeout: float
    ) -> str | None:
        """A command sent to ``target`` before the restart (``SendsCommands``) toward ``state``
        is waited for until ``timeout``, the step's own, has passed since it was sent: no
        second one goes out before. Not landed by then, it is no longer waited for, and the
        step sends it again (the first may never have reached the device). The words for
        that command when it landed meanwhile, for the step's detail."""
        earlier = self.under_way.get(key_of(target))
        if (
            earlier is None
            or earlier.wanted is not state
            or not earlier.before_restart
            or earlier.process is not None
            or earlier.at is None
            or not isinstance(platform, SendsCommands)
        ):
            return None
        if state is PowerState.OFF and isinstance(platform, SeenWhileItAnswers):
            platform.shutdown_accepted(target)  # its going quiet is that shutdown landing
        left = timeout - (self._clock.now() - earlier.at).total_seconds()
        if left > 0:
            if self._on_wait is not None:
                until = format_duration(timeout)
                self._on_wait(step, f"waiting for {earlier.said()} ({target.name}), up to {until}")
            if await platform.wait_for(target, state, left):
                return earlier.said()  # landed: the step finds its target there
        log.warning(
            "%s: %s did not land within %s: sending it again",
            target.name,
            earlier.said(),
            format_duration(timeout),
        )
        self.under_way.pop(key_of(target), None)
        return None

    async def _under_way(self, platform: Platform, target: Target, state: PowerState) -> str | None:
        """In a resumed run, or without the store (the other controller may have asked), the
        platform's own task still taking ``target`` to ``state``. Tasks that cannot be read
        are no reason to leave a target running: the step asks."""
        if not self._resumed and self._alone_lag_s() is None:
            return None
        listed = await self._listed(platform, target, state)
        if not isinstance(listed, str):
            return None
        since = ", under way before the restart" if self._resumed else ", under way"
        return f"{listed}{since}"

    async def _listed(
        self, platform: Platform, target: Target, state: PowerState
    ) -> str | bool | None:
        """The platform's own task taking ``target`` to ``state`` (its line); False when the
        platform lists its tasks and none is; None when it cannot tell."""
        if not isinstance(platform, InFlightTasks):
            return None
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                found = await platform.in_flight(target, state)
        except (UpsguardError, TimeoutError) as exc:
            why = str(exc) or "no answer"
            log.warning("%s: its tasks under way could not be read (%s)", target.name, why)
            return None
        if found is None:
            return False
        log.info("%s: %s is under way already", target.name, found)
        return found

    async def _power_on(
        self, step: StepId, settings: StepSettings, platform: Platform, target: Target
    ) -> None:
        if settings.power_on_via is None:

            async def power_on() -> None:
                earlier = self.under_way.get(key_of(target))
                if earlier is not None and earlier.wanted is PowerState.ON:
                    return  # sent, then no answer in time: under way, not sent twice
                await self._request(step, platform, target, PowerState.ON)

            await ask(power_on, settings.retries, _allowance_s(platform, settings))
            return
        bmc = self._platform(settings.power_on_via)
        bmc_targets = await ask(lambda: bmc.resolve(settings.resource), settings.retries)
        for bmc_target in bmc_targets:
            power_on = functools.partial(bmc.start, bmc_target)
            await ask(functools.partial(self._fenced, power_on), settings.retries)
        self._asked(step, target, PowerState.ON)


def _allowance_s(platform: Platform, settings: StepSettings) -> float:
    """How long one request may take. A command run to its end (``RunsProcesses``,
    ``SendsCommands``) is the step's own work: the step's timeout bounds it (and the
    platform's own timeout the command), not the allowance of a request to an API, which
    would cut a command slower than that and ask again."""
    if isinstance(platform, RunsProcesses | SendsCommands):
        return settings.timeout_s
    return CALL_TIMEOUT_S


def _combine(
    step: Step, results: list[TargetResult], started: datetime, ended: datetime
) -> StepOutcome:
    if not results:
        return StepOutcome(step.id, StepState.DONE, started, ended, "nothing to do: no targets")
    if len(results) == 1:
        only = results[0]
        return StepOutcome(
            step.id,
            only.state,
            started,
            ended,
            only.detail,
            only.attempts,
            only.fallback_used,
            only.already_there,
        )
    failed = [r for r in results if r.state is StepState.FAILED]
    skipped = [r for r in results if r.state is StepState.SKIPPED]
    interrupted = [r for r in results if r.state is StepState.INTERRUPTED]
    fallback = any(r.fallback_used for r in results)
    if interrupted:  # the term ended: the controller that leads now finishes the step
        detail = "; ".join(r.detail for r in interrupted[:3])
        return StepOutcome(step.id, StepState.INTERRUPTED, started, ended, detail, 1, fallback)
    state = StepState.FAILED if failed else StepState.DONE
    if not failed and len(skipped) == len(results):
        state = StepState.SKIPPED
    done = len(results) - len(failed) - len(skipped)
    detail = f"{done} of {len(results)} done"
    if skipped:
        detail += f", {len(skipped)} left running"
    if failed:
        detail += "; " + "; ".join(r.detail for r in failed[:3])
    already = all(r.already_there for r in results)
    return StepOutcome(
        step.id, state, started, ended, detail, 1, fallback, already, left_running=len(skipped)
    )
