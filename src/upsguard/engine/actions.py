"""What one step does to each of its targets: check, act, wait, fall back, retry.

Every step is idempotent: it reads the target's state first (a VM already
off is done), so a step that a crash interrupted can run again safely.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from upsguard.clock import Clock
from upsguard.config.resources import ResourceConfig
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.engine.health import wait_healthy
from upsguard.engine.retry import RequestWatchdog
from upsguard.engine.slots import Slots
from upsguard.errors import GracefulUnavailable, StepTimeout, UpsguardError
from upsguard.models import PlatformName, PowerState, StepOutcome, StepState, StopMethod, Target
from upsguard.plugins.platforms.base import Platform
from upsguard.runbooks.plan import Direction, Step

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 120.0  # one request to a platform; waiting for a state has its own timeout
HARD_OFF_WAIT_S = 60.0


class TargetResult(NamedTuple):
    target: Target
    state: StepState
    detail: str
    attempts: int = 1
    fallback_used: bool = False


class StepRunner:
    def __init__(
        self,
        site: SiteConfig,
        platforms: Mapping[PlatformName, Platform],
        clock: Clock,
        direction: Direction,
    ) -> None:
        self._site = site
        self._resources = site.resource_index()
        self._platforms = platforms
        self._clock = clock
        self._direction = direction
        self.slots: dict[PlatformName, Slots] = {}
        self._watchdog = RequestWatchdog(CALL_TIMEOUT_S)

    async def run(self, step: Step, started: datetime) -> StepOutcome:
        res = self._resources[step.resource]
        try:
            platform = self._platform(step.platform)
            targets = list(step.targets) or await self._watchdog.ask(
                lambda: platform.resolve(res, direct=step.direct), res.retries
            )
            if len(targets) == 1:
                results = [await self._one(step, res, platform, targets[0])]
            else:
                results = await asyncio.gather(
                    *(self._one(step, res, platform, t) for t in targets)
                )
        except UpsguardError as exc:
            return StepOutcome(step.id, StepState.FAILED, started, self._clock.now(), str(exc))
        return _combine(step, list(results), started, self._clock.now())

    def _platform(self, name: str | None) -> Platform:
        if name is None or PlatformName(name) not in self._platforms:
            raise StepTimeout(f"no platform '{name}' is open for this run")
        return self._platforms[PlatformName(name)]

    async def _one(
        self, step: Step, res: ResourceConfig, platform: Platform, target: Target
    ) -> TargetResult:
        slot = self.slots.get(PlatformName(step.platform or ""))
        if slot is not None and not slot.take_now():
            await slot.wait_turn()
        try:
            if self._direction is Direction.SHUTDOWN:
                return await self._stop(res, platform, target)
            return await self._start(res, platform, target)
        except UpsguardError as exc:
            return TargetResult(target, StepState.FAILED, f"{target.name}: {exc}")
        except Exception as exc:  # a plugin bug must not stop the other steps at 3 a.m.
            log.exception("step %s on %s failed unexpectedly", step.id, target.name)
            return TargetResult(target, StepState.FAILED, f"{target.name}: internal error: {exc!r}")
        finally:
            if slot is not None:
                slot.release()

    async def _stop(self, res: ResourceConfig, platform: Platform, target: Target) -> TargetResult:
        grace = res.guest_timeout.total_seconds()
        try:
            if not await self._watchdog.ask(lambda: _ask_to_stop(platform, target), res.retries):
                return TargetResult(target, StepState.DONE, f"{target.name} already off")
            if await platform.wait_for(target, PowerState.OFF, grace):
                return TargetResult(target, StepState.DONE, f"{target.name} shut down")
            why = f"still on after {format_duration(grace)}"
        except GracefulUnavailable as exc:
            fallback = self._site.fallback_without_graceful(res)
            return await self._fallback(res, platform, target, str(exc), fallback)
        return await self._fallback(res, platform, target, why, res.fallback)

    async def _fallback(
        self, res: ResourceConfig, platform: Platform, target: Target, why: str, fallback: str
    ) -> TargetResult:
        why = why if why.startswith(f"{target.name}:") else f"{target.name}: {why}"
        if fallback == "skip":
            log.warning("%s; left running (fallback: skip)", why)
            return TargetResult(target, StepState.SKIPPED, f"{why}; left running")
        if fallback == "fail":
            return TargetResult(target, StepState.FAILED, why)
        await self._watchdog.ask(lambda: platform.stop(target, StopMethod.HARD), res.retries)
        if await platform.wait_for(target, PowerState.OFF, HARD_OFF_WAIT_S):
            detail = f"{why}; powered off"
            return TargetResult(target, StepState.DONE, detail, fallback_used=True)
        return TargetResult(target, StepState.FAILED, f"{why}; power-off failed")

    async def _start(self, res: ResourceConfig, platform: Platform, target: Target) -> TargetResult:
        timeout = res.health.timeout.total_seconds() if res.health else 600.0
        state = await self._watchdog.ask(lambda: platform.power_state(target), res.retries)
        if state is not PowerState.ON:
            await self._power_on(res, platform, target)
            if not await platform.wait_for(target, PowerState.ON, timeout):
                return TargetResult(
                    target,
                    StepState.FAILED,
                    f"{target.name} not on after {format_duration(timeout)}",
                )
        try:
            await wait_healthy(res, target, platform, self._clock)
        except StepTimeout as exc:
            return TargetResult(target, StepState.FAILED, str(exc))
        done = "up" if state is not PowerState.ON else "already up"
        return TargetResult(target, StepState.DONE, f"{target.name} {done}")

    async def _power_on(self, res: ResourceConfig, platform: Platform, target: Target) -> None:
        if res.power_on_via is None:
            await self._watchdog.ask(lambda: platform.start(target), res.retries)
            return
        bmc = self._platform(res.power_on_via)
        bmc_targets = await self._watchdog.ask(lambda: bmc.resolve(res), res.retries)
        for bmc_target in bmc_targets:
            await self._watchdog.ask(lambda t=bmc_target: bmc.start(t), res.retries)  # type: ignore[misc]


async def _ask_to_stop(platform: Platform, target: Target) -> bool:
    """Read the state, then ask for a graceful stop: one request allowance covers both, and
    a retry reads the state again. False when the target is already off."""
    if await platform.power_state(target) is PowerState.OFF:
        return False
    await platform.stop(target, StopMethod.GRACEFUL)
    return True


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
