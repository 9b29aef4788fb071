"""How vSphere's property values read as upsguard power states."""

from __future__ import annotations

from typing import Any

from upsguard.models import PowerState

TOOLS_RUNNING = "guestToolsRunning"

_VM_POWER = {
    "poweredOn": PowerState.ON,
    "poweredOff": PowerState.OFF,
    "suspended": PowerState.OFF,
}


def vm_power(props: dict[str, Any]) -> PowerState:
    return _VM_POWER.get(str(props.get("runtime.powerState")), PowerState.UNKNOWN)


def host_power(props: dict[str, Any]) -> PowerState:
    """vCenter shows a host it lost (``host_lost``) with its power state unknown: one shut
    down, unplugged, or cut off by a broken management network, alike. Off only once the
    host accepted its shutdown (``HostSteps.power``)."""
    power = str(props.get("runtime.powerState"))
    connection = str(props.get("runtime.connectionState"))
    if power == "standBy":
        return PowerState.STANDBY
    if power == "poweredOff":
        return PowerState.OFF
    if power == "poweredOn" and connection == "connected":
        return PowerState.ON
    return PowerState.UNKNOWN


def host_lost(props: dict[str, Any]) -> bool:
    return str(props.get("runtime.connectionState")) == "notResponding"


def is_off(props: dict[str, Any]) -> bool:
    return vm_power(props) is PowerState.OFF
