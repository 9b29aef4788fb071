"""Live inventory: each VM resource resolved on its platform, with the host it runs on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from upsguard.config.site import SiteConfig
from upsguard.models import PlatformName, ResourceId, ResourceKind, Target
from upsguard.plugins.platforms.base import Platform


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
