"""upsguard's NUT-style commands as SNMP SETs: which objects each MIB sets, in which order.

The delay is the entry's ``at_shutdown_end.delay``. The SETs of a command go one at a time,
the harmless ones first, so that an agent refusing one leaves the UPS as it was rather than
half told (a stay-off whose "no restart" was refused must not go on to cut the power).

UPS-MIB (RFC 1628, upsControl):

- ``load.off``: upsShutdownAfterDelay 0 (now); ``load.off.delay``: upsShutdownAfterDelay delay.
- ``shutdown.return``: upsStartupAfterDelay delay + ``OFF_AT_LEAST_S``, then
  upsShutdownAfterDelay delay. RFC 1628: "if the countdown expires during a utility failure,
  the startup shall not occur until the utility power is restored", so the load comes back
  with the mains, and is cycled even when the mains came back before the delay ran out.
- ``shutdown.stayoff``: upsAutoRestart off(2), then upsShutdownAfterDelay delay: with
  upsAutoRestart on, a UPS restarts after a delayed shutdown during a power loss. The card keeps
  the setting afterwards.

APC PowerNet (upsAdvControl, upsAdvConfig):

- ``load.off``: upsAdvControlUpsOff turnUpsOff(2), now.
- ``load.off.delay`` and ``shutdown.stayoff``: upsAdvConfigShutoffDelay delay (TimeTicks), then
  upsAdvControlUpsOff turnUpsOffGracefully(3): off after the delay, "regardless of the input
  line state".
- ``shutdown.return``: upsAdvConfigShutoffDelay delay, then upsAdvControlRebootShutdownUps
  rebootShutdownUpsGracefully(3): off after the delay, on again when good AC input is there.
  upsAdvControlUpsOff itself has no value that returns (its values: noTurnUpsOff(1),
  turnUpsOff(2), turnUpsOffGracefully(3) and three for synchronized groups); NUT's apc-mib
  uses upsBasicControlConserveBattery instead, which the card refuses (badValue) unless the
  UPS is on battery and which says nothing of a delay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pysnmp.proto.rfc1902 import Integer, TimeTicks

from upsguard.plugins.ups.snmp.readings import APC, UPS_MIB

OFF_AT_LEAST_S = 30
"""UPS-MIB shutdown.return: the load stays off this long at least before the UPS starts it
again, so that machines set to power on after an AC loss see one."""


@dataclass(frozen=True, slots=True)
class Set:
    """One SET: the MIB object (named in messages), its instance, its value from the delay."""

    name: str
    oid: str
    value: Callable[[int], Integer | TimeTicks]


def _seconds(delay_s: int) -> Integer:
    return Integer(delay_s)


def _now(delay_s: int) -> Integer:
    return Integer(0)


def _fixed(value: int) -> Callable[[int], Integer]:
    return lambda delay_s: Integer(value)


def _ticks(delay_s: int) -> TimeTicks:
    return TimeTicks(delay_s * 100)


_SHUTDOWN = f"{UPS_MIB}.8.2.0"
_STARTUP = f"{UPS_MIB}.8.3.0"
_AUTO_RESTART = f"{UPS_MIB}.8.5.0"
_SHUTOFF_DELAY = f"{APC}.5.2.10.0"
_UPS_OFF = f"{APC}.6.2.1.0"
_REBOOT = f"{APC}.6.2.2.0"

SETS: dict[str, dict[str, tuple[Set, ...]]] = {
    "ups-mib": {
        "load.off": (Set("upsShutdownAfterDelay", _SHUTDOWN, _now),),
        "load.off.delay": (Set("upsShutdownAfterDelay", _SHUTDOWN, _seconds),),
        "shutdown.return": (
            Set("upsStartupAfterDelay", _STARTUP, lambda d: Integer(d + OFF_AT_LEAST_S)),
            Set("upsShutdownAfterDelay", _SHUTDOWN, _seconds),
        ),
        "shutdown.stayoff": (
            Set("upsAutoRestart", _AUTO_RESTART, _fixed(2)),  # off(2)
            Set("upsShutdownAfterDelay", _SHUTDOWN, _seconds),
        ),
    },
    "powernet": {
        "load.off": (Set("upsAdvControlUpsOff", _UPS_OFF, _fixed(2)),),  # turnUpsOff
        "load.off.delay": (
            Set("upsAdvConfigShutoffDelay", _SHUTOFF_DELAY, _ticks),
            Set("upsAdvControlUpsOff", _UPS_OFF, _fixed(3)),  # turnUpsOffGracefully
        ),
        "shutdown.stayoff": (
            Set("upsAdvConfigShutoffDelay", _SHUTOFF_DELAY, _ticks),
            Set("upsAdvControlUpsOff", _UPS_OFF, _fixed(3)),  # turnUpsOffGracefully
        ),
        "shutdown.return": (
            Set("upsAdvConfigShutoffDelay", _SHUTOFF_DELAY, _ticks),
            Set("upsAdvControlRebootShutdownUps", _REBOOT, _fixed(3)),  # ...UpsGracefully
        ),
    },
}
