"""How vSphere's property values read as upsguard power states."""

from __future__ import annotations

from typing import Any

from upsguard.models import PowerState, ResourceKind, Target

TOOLS_RUNNING = "guestToolsRunning"

_VM_POWER = {
    "poweredOn": PowerState.ON,
    "poweredOff": PowerState.OFF,
    "suspended": PowerState.OFF,
}


def vm_power(props: dict[str, Any]) -> PowerState:
    return _VM_POWER.get(str(props.get("runtime.powerState")), PowerState.UNKNOWN)


def host_power(props: dict[str, Any]) -> PowerState:
    """vCenter shows a host it lost (shut down, unplugged) as notResponding: that is off."""
    power = str(props.get("runtime.powerState"))
    connection = str(props.get("runtime.connectionState"))
    if power == "standBy":
        return PowerState.STANDBY
    if power == "poweredOff" or connection == "notResponding":
        return PowerState.OFF
    if power == "poweredOn" and connection == "connected":
        return PowerState.ON
    return PowerState.UNKNOWN


def power_of(target: Target, props: dict[str, Any]) -> PowerState:
    return host_power(props) if target.kind is ResourceKind.HOST else vm_power(props)


def is_off(props: dict[str, Any]) -> bool:
    return vm_power(props) is PowerState.OFF
