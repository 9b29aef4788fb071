"""What one step does to each of its targets: check, act, wait, fall back, retry.

Every step is idempotent: it reads the target's state first (a VM already
off is done), so a step that a crash interrupted can run again safely. In a
resumed run it also asks a platform that lists its tasks (``InFlightTasks``)
whether the request is still under way (a host shutting down still reads on),
and waits for that task instead of asking a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from upsguard.clock import Clock
from upsguard.config.resources import Fallback
from upsguard.config.types import format_duration
from upsguard.engine.health import wait_healthy
from upsguard.engine.retry import CALL_TIMEOUT_S, ask
from upsguard.engine.slots import Slots
from upsguard.errors import GracefulUnavailable, PermanentError, StepTimeout, UpsguardError
from upsguard.models import (
    Direction,
    PlatformName,
    PowerState,
    StepOutcome,
    StepState,
    StopMethod,
    Target,
)
from upsguard.plugins.platforms.base import InFlightTasks, Platform
from upsguard.runbooks.plan import Step, StepSettings

log = logging.getLogger(__name__)

HARD_OFF_WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class Request:
    """What a step found before it waits: nothing to ask (already there), a request made
    now, or the platform's own task still under way from before a restart (waited for,
    not repeated)."""

    needed: bool = True
    under_way: str | None = None

    def said(self) -> str:
        """The words the step's detail adds."""
        if self.under_way is None:
            return ""
        return f" (waited for {self.under_way}, under way before the restart)"


ALREADY_THERE = Request(needed=False)


@dataclass(frozen=True, slots=True)
class TargetResult:
    target: Target
    state: StepState
    detail: str
    attempts: int = 1
    fallback_used: bool = False


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
    ) -> None:
        """``network_probes``: False in a dry run (health checks ask the platform only).
        ``resumed``: the run was cut short before; tasks still under way are waited for."""
        self._network_probes = network_probes
        self._resumed = resumed
        self._platforms = platforms
        self._clock = clock
        self._direction = direction
        self._slots = slots

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
        try:
            async with slot or contextlib.nullcontext():
                if self._direction is Direction.SHUTDOWN:
                    return await self._stop(settings, platform, target)
                return await self._start(settings, platform, target)
        except UpsguardError as exc:
            return TargetResult(target, StepState.FAILED, f"{target.name}: {exc}")
        except Exception as exc:  # a plugin bug must not stop the other steps at 3 a.m.
            log.exception("step %s on %s failed unexpectedly", step.id, target.name)
            return TargetResult(target, StepState.FAILED, f"{target.name}: internal error: {exc!r}")

    async def _stop(
        self, settings: StepSettings, platform: Platform, target: Target
    ) -> TargetResult:
        grace = settings.timeout_s
        try:
            asked = await ask(lambda: self._ask_to_stop(platform, target), settings.retries)
            if not asked.needed:
                return TargetResult(target, StepState.DONE, f"{target.name} already off")
            if await platform.wait_for(target, PowerState.OFF, grace):
                detail = f"{target.name} shut down{asked.said()}"
                return TargetResult(target, StepState.DONE, detail)
            why = f"still on after {format_duration(grace)}{asked.said()}"
        except GracefulUnavailable as exc:
            fallback = settings.fallback_without_graceful
            return await self._fallback(settings, platform, target, str(exc), fallback)
        return await self._fallback(settings, platform, target, why, settings.fallback)

    async def _fallback(
        self,
        settings: StepSettings,
        platform: Platform,
        target: Target,
        why: str,
        fallback: Fallback,
    ) -> TargetResult:
        why = why if why.startswith(f"{target.name}:") else f"{target.name}: {why}"
        if fallback == "skip":
            log.warning("%s; left running (fallback: skip)", why)
            return TargetResult(target, StepState.SKIPPED, f"{why}; left running")
        if fallback == "fail":
            return TargetResult(target, StepState.FAILED, why)
        await ask(lambda: platform.stop(target, StopMethod.HARD), settings.retries)
        if await platform.wait_for(target, PowerState.OFF, HARD_OFF_WAIT_S):
            detail = f"{why}; powered off"
            return TargetResult(target, StepState.DONE, detail, fallback_used=True)
        return TargetResult(target, StepState.FAILED, f"{why}; power-off failed")

    async def _start(
        self, settings: StepSettings, platform: Platform, target: Target
    ) -> TargetResult:
        timeout = settings.timeout_s
        state = await ask(lambda: platform.power_state(target), settings.retries)
        asked = ALREADY_THERE
        if state is not PowerState.ON:
            found = await self._under_way(platform, target, PowerState.ON)
            if found is None:
                await self._power_on(settings, platform, target)
            asked = Request(under_way=found)
            if not await platform.wait_for(target, PowerState.ON, timeout):
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
        done = "up" if state is not PowerState.ON else "already up"
        return TargetResult(target, StepState.DONE, f"{target.name} {done}{asked.said()}")

    async def _ask_to_stop(self, platform: Platform, target: Target) -> Request:
        """Read the state, then ask for a graceful stop unless a resumed step finds its task
        under way: one request allowance covers them, and a retry reads the state again."""
        if await platform.power_state(target) is PowerState.OFF:
            return ALREADY_THERE
        under_way = await self._under_way(platform, target, PowerState.OFF)
        if under_way is None:
            await platform.stop(target, StopMethod.GRACEFUL)
        return Request(under_way=under_way)

    async def _under_way(self, platform: Platform, target: Target, state: PowerState) -> str | None:
        """In a resumed run, the platform's own task still taking ``target`` to ``state``.
        Tasks that cannot be read are no reason to leave a target running: the step asks."""
        if not self._resumed or not isinstance(platform, InFlightTasks):
            return None
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                found = await platform.in_flight(target, state)
        except (UpsguardError, TimeoutError) as exc:
            why = str(exc) or "no answer"
            log.warning("%s: its tasks under way could not be read (%s): asking", target.name, why)
            return None
        if found is not None:
            log.info("%s: %s is still under way from before the restart", target.name, found)
        return found

    async def _power_on(self, settings: StepSettings, platform: Platform, target: Target) -> None:
        if settings.power_on_via is None:
            await ask(lambda: platform.start(target), settings.retries)
            return
        bmc = self._platform(settings.power_on_via)
        bmc_targets = await ask(lambda: bmc.resolve(settings.resource), settings.retries)
        for bmc_target in bmc_targets:
            await ask(functools.partial(bmc.start, bmc_target), settings.retries)


def _combine(
    step: Step, results: list[TargetResult], started: datetime, ended: datetime
) -> StepOutcome:
    if not results:
        return StepOutcome(step.id, StepState.DONE, started, ended, "nothing to do: no targets")
    if len(results) == 1:
        only = results[0]
        return StepOutcome(
            step.id, only.state, started, ended, only.detail, only.attempts, only.fallback_used
        )
    failed = [r for r in results if r.state is StepState.FAILED]
    skipped = [r for r in results if r.state is StepState.SKIPPED]
    fallback = any(r.fallback_used for r in results)
    state = StepState.FAILED if failed else StepState.DONE
    if not failed and len(skipped) == len(results):
        state = StepState.SKIPPED
    done = len(results) - len(failed) - len(skipped)
    detail = f"{done} of {len(results)} done"
    if skipped:
        detail += f", {len(skipped)} left running"
    if failed:
        detail += "; " + "; ".join(r.detail for r in failed[:3])
    return StepOutcome(step.id, state, started, ended, detail, 1, fallback)
