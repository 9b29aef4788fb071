"""The ``none`` platform: resources upsguard never powers; they go down with the UPS.

A core switch, a modem, a KVM console: they stay up as long as the batteries
last and come back by themselves with the power. They are still resources, so
the plan can order others around them (the NAS stops before the switch goes).
Stopping or starting one does nothing but say, in the log and the step's
outcome, that the resource is left to the UPS.
"""

from __future__ import annotations

import logging

from upsguard.clock import Clock
from upsguard.config.platforms import NoPlatform as NoPlatformSettings
from upsguard.config.resources import ResourceConfig
from upsguard.models import PlatformName, PowerState, StopMethod, Target

__all__ = ["NoPlatform"]

log = logging.getLogger(__name__)


class NoPlatform:
    """Resolves resources to targets and leaves their power to the UPS."""

    def __init__(self, name: PlatformName, settings: NoPlatformSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return [Target(self.name, resource.kind, resource.target_name, ref=str(resource.id))]

    async def power_state(self, target: Target) -> PowerState:
        """Unknown: nothing here can read it."""
        return PowerState.UNKNOWN

    async def stop(self, target: Target, method: StopMethod) -> None:
        log.info("%s is left to the UPS: it goes down when the batteries run out", target.name)

    async def start(self, target: Target) -> None:
        log.info("%s is left to the UPS: it comes back with the power", target.name)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        """Nothing to wait for: the step is done once the resource is left to the UPS."""
        return True

    async def healthy(self, target: Target) -> bool:
        return True
