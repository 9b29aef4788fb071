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


def host_power(props: dict[str, Any], shut_down: bool = False) -> PowerState:
    """vCenter shows a host it lost as notResponding: one shut down, unplugged, or cut off by
    a broken management network, alike. That is off only once the host accepted its
    shutdown (``shut_down``); before, it is unknown."""
    power = str(props.get("runtime.powerState"))
    connection = str(props.get("runtime.connectionState"))
    if power == "standBy":
        return PowerState.STANDBY
    if power == "poweredOff":
        return PowerState.OFF
    if connection == "notResponding":
        return PowerState.OFF if shut_down else PowerState.UNKNOWN
    if power == "poweredOn" and connection == "connected":
        return PowerState.ON
    return PowerState.UNKNOWN


def is_off(props: dict[str, Any]) -> bool:
    return vm_power(props) is PowerState.OFF
