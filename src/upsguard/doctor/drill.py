"""``upsguard drill``: the shutdown plan rehearsed against the real site, read-only.

Each step does what a real step does first, and stops there: its targets are resolved on
their platform and their state read (both timed), and its preconditions are checked (the
platform logged in, a graceful path for a VM, the caches in a hardware step's data path
read). The drill says, step by step in the plan's order, what would act, what is already
done, and what would fail. Nothing is stopped, flipped or sent; nothing is journaled, so a
drill's timings never teach the real plan its durations (they time reads, not shutdowns).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_bytes
from upsguard.engine.destage import CacheStatus, DestageWatch
from upsguard.engine.inventory import read_inventory
from upsguard.errors import UpsguardError
from upsguard.events import Event
from upsguard.findings import Verdict
from upsguard.models import CacheName, Direction, PlatformName, PowerState, ResourceKind, Target
from upsguard.plugins import catalog
from upsguard.plugins.platforms.base import Platform, PlatformDiagnosis
from upsguard.runbooks.plan import Action, Plan, Step
from upsguard.runbooks.planner import Planner


class Would(enum.StrEnum):
    """What a step would do if the outage were now."""

    ACT = "act"
    """Its targets are up and it can reach them: it would stop them."""
    DONE = "done"
    """Everything it stops is already off (or it has nothing to stop)."""
    FAIL = "fail"
    """It would fail: its platform does not log in, a target does not resolve or read, or
    a VM has no graceful path and its fallback is to fail."""


@dataclass(frozen=True, slots=True)
class DrillStep:
    step: str
    action: str
    platform: str | None
    would: Would
    detail: str
    """What it would do, or why it would fail, in one line."""
    targets: tuple[str, ...]
    states: tuple[str, ...]
    """Each target's power state as read now, in the order of ``targets``."""
    read_s: float
    """How long resolving and reading took: the part of a real step a drill can time."""


@dataclass(frozen=True)
class Drill:
    steps: tuple[DrillStep, ...]
    estimate_s: float
    """The plan's own estimate of the shutdown (configured or learned durations)."""
    live: bool
    """The plan was made from live inventory."""
    took_s: float

    @property
    def exit_code(self) -> int:
        return 1 if any(s.would is Would.FAIL for s in self.steps) else 0


async def run_drill(site: SiteConfig, clock: Clock, timeout_s: float = 30.0) -> Drill:
    began = time.monotonic()
    platforms: dict[PlatformName, Platform] = {}
    down: dict[str, str] = {}
    stopping = {r.platform for r in site.resources if r.platform is not None and r.stops}
    for name in sorted(stopping):  # a BMC that only powers machines on has no part in it
        settings = site.platform(name)
        try:
            cls = catalog.load("platform", getattr(settings, "type", name))
            platforms[PlatformName(name)] = cls(PlatformName(name), settings, clock)
        except UpsguardError as exc:
            down[name] = str(exc)
    providers = {}
    for cache in site.caches:
        try:
            providers[cache.name] = catalog.load("cache", cache.provider)(cache, clock)
        except UpsguardError as exc:
            down[cache.name] = str(exc)
    caches = DestageWatch(site, providers, clock, _nowhere)
    try:
        for name, why in zip(
            platforms,
            await asyncio.gather(*(_open(p, timeout_s) for p in platforms.values())),
            strict=True,
        ):
            if why is not None:
                down[name] = why
        opened = {n: p for n, p in platforms.items() if n not in down}
        plan, live = await _plan(site, opened, timeout_s)
        statuses = await _caches(caches, plan, timeout_s)
        steps = await asyncio.gather(
            *(_rehearse(site, step, opened, down, statuses, timeout_s) for step in plan.steps)
        )
    finally:
        await asyncio.gather(*(p.close() for p in platforms.values()), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in providers.values()), return_exceptions=True)
    kept = tuple(s for s in steps if s is not None)
    return Drill(kept, plan.estimate_s, live, time.monotonic() - began)


def _nowhere(event: Event) -> None:
    """A drill journals nothing and tells nobody: its events go nowhere."""


async def _open(platform: Platform, timeout_s: float) -> str | None:
    try:
        async with asyncio.timeout(timeout_s):
            await platform.open()
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except UpsguardError as exc:
        return str(exc)
    return None


async def _plan(
    site: SiteConfig, platforms: Mapping[PlatformName, Platform], timeout_s: float
) -> tuple[Plan, bool]:
    """The shutdown plan as the service would make it now: from live inventory if it reads."""
    try:
        async with asyncio.timeout(timeout_s):
            live = await read_inventory(site, platforms)
    except (UpsguardError, TimeoutError, KeyError):
        return Planner(site).plan(Direction.SHUTDOWN), False
    planner = Planner(site, live.targets, live.unplanned)
    return planner.plan(Direction.SHUTDOWN), True


async def _caches(
    caches: DestageWatch, plan: Plan, timeout_s: float
) -> dict[CacheName, list[CacheStatus]]:
    if not plan.caches:
        return {}
    try:
        async with asyncio.timeout(timeout_s):
            found = await caches.poll(plan.caches)
    except TimeoutError:
        return {}
    out: dict[CacheName, list[CacheStatus]] = {}
    for status in found:
        out.setdefault(status.cache, []).append(status)
    return out


async def _rehearse(
    site: SiteConfig,
    step: Step,
    platforms: Mapping[PlatformName, Platform],
    down: Mapping[str, str],
    caches: Mapping[CacheName, list[CacheStatus]],
    timeout_s: float,
) -> DrillStep | None:
    if step.action is Action.BARRIER or step.settings is None:
        return None
    began = time.monotonic()

    def row(
        would: Would,
        detail: str,
        targets: Sequence[Target] = (),
        states: Sequence[str] = (),
    ) -> DrillStep:
        return DrillStep(
            step.id,
            step.action.value,
            step.platform,
            would,
            detail,
            tuple(t.name for t in targets),
            tuple(states),
            time.monotonic() - began,
        )

    name = step.platform
    if name is None or name == "none":
        return row(Would.DONE, "no platform: it goes down with the UPS")
    if name in down:
        return row(Would.FAIL, f"platform {name}: {down[name]}")
    platform = platforms[PlatformName(name)]
    try:
        async with asyncio.timeout(timeout_s):
            targets = list(step.targets) or await platform.resolve(
                step.settings.resource, direct=step.direct
            )
            states = await asyncio.gather(*(platform.power_state(t) for t in targets))
    except TimeoutError:
        return row(Would.FAIL, f"no answer from {name} within {timeout_s:g}s")
    except UpsguardError as exc:
        return row(Would.FAIL, str(exc))
    words = [s.value for s in states]
    unread = [t.name for t, s in zip(targets, states, strict=True) if s is PowerState.UNKNOWN]
    if unread:  # never "already off": the step would ask, and fail if it still cannot reach
        refused = await _preconditions(platform, step, timeout_s)
        said = f"the state of {', '.join(unread[:4])} cannot be read"
        return row(Would.FAIL, f"{said}: {refused}" if refused else said, targets, words)
    up = [t for t, s in zip(targets, states, strict=True) if s is not PowerState.OFF]
    if not up:
        return row(Would.DONE, "already off" if targets else "nothing to stop", targets, words)
    refused = await _preconditions(platform, step, timeout_s)
    if refused is not None:
        return row(Would.FAIL, refused, targets, words)
    return row(*_would(site, step, up, caches), targets, words)


async def _preconditions(platform: Platform, step: Step, timeout_s: float) -> str | None:
    """What the platform's own checks say against this step (an SSH host key nobody vouched
    for, a privilege the user lacks): read-only by their contract."""
    if not isinstance(platform, PlatformDiagnosis) or step.settings is None:
        return None
    try:
        async with asyncio.timeout(timeout_s):
            found = await platform.diagnose([step.settings.resource])
    except TimeoutError:
        return f"its platform's checks did not answer within {timeout_s:g}s"
    except UpsguardError as exc:
        return str(exc)
    failed = [f for f in found if f.verdict is Verdict.FAIL]
    return "; ".join(f"{f.detail} ({f.fix})" for f in failed) or None


def _would(
    site: SiteConfig, step: Step, up: list[Target], caches: Mapping[CacheName, list[CacheStatus]]
) -> tuple[Would, str]:
    """What the step would do with the targets that are up, and what it would wait for."""
    assert step.settings is not None
    res = step.settings.resource
    names = ", ".join(t.name for t in up[:4]) + (f" and {len(up) - 4} more" if len(up) > 4 else "")
    waits = _cache_wait(step, caches)
    if step.kind in (ResourceKind.VM, ResourceKind.VM_GROUP):
        without = [t.name for t in up if t.graceful is False]
        if without:
            fallback = step.settings.fallback_without_graceful
            if fallback == "fail":
                return Would.FAIL, f"no graceful path in {', '.join(without)} (fallback fail)"
            how = "leave running" if fallback == "skip" else "power off hard"
            return Would.ACT, f"shut down {names}; {how} {', '.join(without)} (no VMware Tools)"
        return Would.ACT, f"shut down the guest of {names}"
    if waits is not None and waits.startswith("cannot"):
        return Would.FAIL, waits
    if res.shutdown:
        text = f"run '{res.shutdown}' on {names}"
    else:
        text = f"shut down host {names}" if step.kind is ResourceKind.HOST else f"stop {names}"
        if res.kind is ResourceKind.HOST and res.maintenance_mode:
            text += " (maintenance mode first)"
    if res.runs_upsguard:
        text += ", the machine running upsguard, last"
    return Would.ACT, text + (f"; {waits}" if waits else "")


def _cache_wait(step: Step, caches: Mapping[CacheName, list[CacheStatus]]) -> str | None:
    """A hardware step waits for the caches in its data path: what they hold now."""
    said = []
    for name in step.caches:
        statuses = caches.get(name)
        if statuses is None:
            return f"cannot read cache {name}, which this step waits for"
        for status in statuses:
            if status.error is not None:
                return f"cannot read cache {name}: {status.error}"
        dirty = sum(s.state.dirty_bytes or 0 for s in statuses if s.state is not None)
        said.append(f"{name} ({format_bytes(dirty)} dirty now)")
    return f"after the destage of {', '.join(said)}" if said else None
