"""Live inventory: each VM resource resolved on its platform, with the host it runs on, and
the running VMs no resource covers. Plans made from it know where each VM really is, so
a cache in a VM's data path gates the host it really runs on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from upsguard.config.site import SiteConfig
from upsguard.models import PlatformName, ResourceId, ResourceKind, Target
from upsguard.plugins.platforms.base import InventorySource, Platform


@dataclass(frozen=True, slots=True)
class LiveInventory:
    targets: dict[ResourceId, list[Target]]
    """Every VM and VM group resolved on its platform."""
    unplanned: dict[str, list[str]] = field(default_factory=dict)
    """Per host name, the running VMs that no resource resolved to (system VMs aside)."""


async def read_inventory(
    site: SiteConfig, platforms: Mapping[PlatformName, Platform]
) -> LiveInventory:
    """Errors (a platform down, a missing VM, a bad selector) propagate."""
    targets = await live_inventory(site, platforms)
    return LiveInventory(targets, await unplanned_by_host(platforms, targets))


async def live_inventory(
    site: SiteConfig, platforms: Mapping[PlatformName, Platform]
) -> dict[ResourceId, list[Target]]:
    """Resolve every VM and VM group; errors (a missing VM, a bad selector) propagate."""
    vms = [
        r
        for r in site.resources
        if r.kind in (ResourceKind.VM, ResourceKind.VM_GROUP) and r.platform is not None
    ]
    found = await asyncio.gather(
        *(platforms[PlatformName(r.platform or "")].resolve(r) for r in vms)
    )
    return {r.id: list(targets) for r, targets in zip(vms, found, strict=True)}


async def unplanned_by_host(
    platforms: Mapping[PlatformName, Platform], inventory: Mapping[ResourceId, list[Target]]
) -> dict[str, list[str]]:
    """Per host name, the running VMs that no resource resolved to (system VMs aside)."""
    covered = {t.ref or t.name for targets in inventory.values() for t in targets}
    out: dict[str, list[str]] = {}
    for platform in platforms.values():
        if not isinstance(platform, InventorySource):
            continue
        for vm in (await platform.inventory_report())["vms"]:
            running = vm["power"] == "poweredOn" and vm["host"]
            if running and not vm["system"] and vm["ref"] not in covered:
                out.setdefault(vm["host"], []).append(vm["name"])
    return out
