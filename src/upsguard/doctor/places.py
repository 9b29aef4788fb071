"""The checks of the plan's resources and of the live plan: each resource resolves and its
state reads, a guest shutdown is possible where the platform can tell, and every VM a
cache carries has a known place (else every host of its platform waits for that cache).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping

from upsguard.config.resources import ResourceConfig
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.engine.inventory import read_inventory
from upsguard.errors import UpsguardError
from upsguard.findings import Area, Finding, fail, ok, warn
from upsguard.models import Direction, PlatformName, PowerState, ResourceId, ResourceKind, Target
from upsguard.plugins.platforms.base import Platform
from upsguard.runbooks.planner import Planner
from upsguard.units import counted

_VMS = (ResourceKind.VM, ResourceKind.VM_GROUP)


async def check_resource(
    site: SiteConfig, platform: Platform, res: ResourceConfig
) -> list[Finding]:
    """It resolves, its targets' state reads, and (VMs) whether a guest shutdown is possible."""
    try:
        targets = await platform.resolve(res)
    except UpsguardError as exc:
        return [
            fail(
                Area.RESOURCE,
                res.id,
                "resolves",
                str(exc),
                "fix the resource's name or selector (upsguard inventory lists what is there)",
            )
        ]
    if not targets:
        return [
            warn(
                Area.RESOURCE,
                res.id,
                "resolves",
                f"its selector matches no VM on {res.platform} now",
                "check the selector (upsguard inventory lists what is there)",
            )
        ]
    read = await asyncio.gather(*(platform.power_state(t) for t in targets), return_exceptions=True)
    for result in read:
        if isinstance(result, UpsguardError):
            fix = "check that the platform reaches it (a step reads its state first)"
            return [fail(Area.RESOURCE, res.id, "state", str(result), fix)]
        if isinstance(result, BaseException):
            raise result
    states = [r for r in read if isinstance(r, PowerState)]
    if PowerState.UNKNOWN in states:  # never "ok" for what was not read
        fix = "check that upsguard reaches it (address, DNS, its service): a step reads it first"
        said = f"cannot be read: {_states(targets, states)}"
        return [fail(Area.RESOURCE, res.id, "state", said, fix)]
    found = [ok(Area.RESOURCE, res.id, "state", _states(targets, states))]
    if res.kind in _VMS and res.stops:
        found += _guest_shutdown(site, res, targets, states)
    return found


def _states(targets: list[Target], states: list[PowerState]) -> str:
    if len(targets) == 1:
        where = f" (host {targets[0].host})" if targets[0].host else ""
        return f"{targets[0].name}: {states[0].value}{where}"
    tally = Counter(s.value for s in states)
    return f"{len(targets)} VMs: " + ", ".join(f"{n} {s}" for s, n in sorted(tally.items()))


def _guest_shutdown(
    site: SiteConfig, res: ResourceConfig, targets: list[Target], states: list[PowerState]
) -> list[Finding]:
    """A running VM without a graceful path (no VMware Tools) is a fail: the plan would not
    shut it down, only cut it (or leave it to the UPS), and what the guest had not written
    is lost. The executor takes the fallback at once: it does not wait the guest timeout
    for a shutdown that cannot start, so the plan takes no longer (``adds_s`` 0)."""
    running = [t for t, s in zip(targets, states, strict=True) if s is PowerState.ON]
    without = [t.name for t in running if t.graceful is False]
    known = [t for t in running if t.graceful is not None]
    if not known:
        return []
    if not without:
        count = f"{len(known)} running VM" + ("s" if len(known) > 1 else "")
        return [ok(Area.RESOURCE, res.id, "graceful", f"guest shutdown possible in {count}")]
    names = ", ".join(without[:5]) + (f" and {len(without) - 5} more" if len(without) > 5 else "")
    then = {
        "skip": "left running (fallback skip) until the UPS cuts it",
        "fail": "the step fails (fallback fail)",
    }.get(
        site.fallback_without_graceful(res),
        "powered off hard at once, adding nothing to the plan but losing what the guest had "
        "not written",
    )
    return [
        fail(
            Area.RESOURCE,
            res.id,
            "graceful",
            f"no guest shutdown possible in {names} (no VMware Tools running): {then}",
            f"start (or install) VMware Tools in {names}",
            adds_s=0.0,
        )
    ]


async def check_plan(site: SiteConfig, platforms: Mapping[PlatformName, Platform]) -> list[Finding]:
    """The shutdown plan from live inventory, and where each VM a cache carries runs."""
    vm_platforms = {r.platform for r in site.resources if r.kind in _VMS and r.platform}
    absent = sorted(p for p in vm_platforms if PlatformName(p) not in platforms)
    live = None
    why = f"platform {', '.join(absent)} did not log in" if absent else ""
    if not absent:
        try:
            live = await read_inventory(site, platforms)
        except UpsguardError as exc:
            why = str(exc)
    if live is None:
        planner = Planner(site)
        plan = planner.plan(Direction.SHUTDOWN)
        found = [
            warn(
                Area.PLAN,
                "shutdown",
                "plan",
                f"{counted(len(plan.steps), 'step')}, about {format_duration(plan.estimate_s)}, "
                f"from the site file alone: no live inventory ({why})",
                "fix what the other rows say; 'upsguard plan shutdown --live' shows the plan",
            )
        ]
        return found + _placements(site, None)
    planner = Planner(site, live.targets, live.unplanned)
    plan = planner.plan(Direction.SHUTDOWN)
    found = [
        ok(
            Area.PLAN,
            "shutdown",
            "plan",
            f"{counted(len(plan.steps), 'step')}, about {format_duration(plan.estimate_s)} "
            f"(critical path {format_duration(plan.critical_path_s)}), from live inventory",
        )
    ]
    for host, vms in sorted(live.unplanned.items()):
        found.append(
            warn(
                Area.PLAN,
                host,
                "unplanned VMs",
                f"{len(vms)} running VM(s) no resource covers: {', '.join(sorted(vms))}; the "
                "host step shuts them down with a short grace",
                "cover them with a resource (vm or vm_group) so that they stop in order",
            )
        )
    return found + _placements(site, live.targets)


def _placements(
    site: SiteConfig, targets: Mapping[ResourceId, list[Target]] | None
) -> list[Finding]:
    """Each VM a cache carries: on which hosts, so which hosts the cache gates."""
    found: list[Finding] = []
    index = site.resource_index()
    by_target = {r.target_name: r.id for r in site.resources if r.kind is ResourceKind.HOST}
    for cache in site.caches:
        for rid in cache.carries:
            res = index.get(rid)
            if res is None or res.kind not in _VMS or res.platform is None:
                continue
            placed = targets.get(rid) if targets is not None else None
            if res.runs_on and placed is None:
                continue  # the site file says where it runs
            hosts = sorted({t.host for t in placed or [] if t.host})
            unknown = placed is None or any(t.host is None for t in placed)
            if unknown:
                every = [h.id for h in site.hosts_of_platform(res.platform)]
                found.append(
                    warn(
                        Area.PLAN,
                        rid,
                        "placement",
                        f"where {rid} runs is unknown: every host of {res.platform} "
                        f"({', '.join(every) or 'none'}) waits for cache {cache.name}",
                        "let live inventory read it (the platform's login), or give runs_on",
                    )
                )
                continue
            gated = [by_target.get(h, h) for h in hosts]
            found.append(
                ok(
                    Area.PLAN,
                    rid,
                    "placement",
                    f"runs on {', '.join(hosts)}: cache {cache.name} gates {', '.join(gated)}",
                )
            )
    return found
