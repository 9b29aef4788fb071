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

Battery tests (the service's scheduled ones; NUT's names):

- UPS-MIB: ``upsTestId`` set to upsTestQuickBatteryTest (``test.battery.start.quick``),
  upsTestDeepBatteryCalibration (``.deep``) or upsTestAbortTestInProgress
  (``test.battery.stop``), in one SET with ``upsTestSpinLock`` at the value just read, as
  RFC 1628 asks of a manager (the agent refuses a stale lock: two managers never start two
  tests). The result is ``upsTestResultsSummary``.
- PowerNet: ``upsAdvTestDiagnostics`` testDiagnostics(2) for a quick test,
  ``upsAdvTestRuntimeCalibration`` performCalibration(2) for a deep one and
  cancelCurrentCalibration(3) to stop it (a diagnostic cannot be stopped; it takes seconds).
  The results are ``upsAdvTestDiagnosticsResults`` and ``upsAdvTestCalibrationResults``.

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

from pysnmp.proto.rfc1902 import Integer, ObjectIdentifier, TimeTicks

from upsguard.plugins.ups.snmp.readings import APC, UPS_MIB

OFF_AT_LEAST_S = 30
"""UPS-MIB shutdown.return: the load stays off this long at least before the UPS starts it
again, so that machines set to power on after an AC loss see one."""


@dataclass(frozen=True, slots=True)
class Set:
    """One SET: the MIB object (named in messages), its instance, its value from the delay."""

    name: str
    oid: str
    value: Callable[[int], Integer | TimeTicks | ObjectIdentifier]


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
TEST_ID = f"{UPS_MIB}.7.1.0"
TEST_SPIN_LOCK = f"{UPS_MIB}.7.2.0"
_TESTS = f"{UPS_MIB}.7.7"
_APC_DIAGNOSTICS = f"{APC}.7.2.2.0"
_APC_CALIBRATION = f"{APC}.7.2.5.0"


def _test(identifier: int) -> Callable[[int], ObjectIdentifier]:
    return lambda delay_s: ObjectIdentifier(f"{_TESTS}.{identifier}")


#: What upsguard reads back of a battery test, per MIB (``upsguard battery``, the journal).
TEST_RESULTS = {
    "ups-mib": {
        "upsTestResultsSummary": f"{UPS_MIB}.7.3.0",
        "upsTestResultsDetail": f"{UPS_MIB}.7.4.0",
    },
    "powernet": {
        "upsAdvTestDiagnosticsResults": f"{APC}.7.2.3.0",
        "upsAdvTestCalibrationResults": f"{APC}.7.2.6.0",
    },
}
#: An object of each MIB's control group that is a setting, not an action: writing it the
#: value it has changes nothing, and shows whether the community or user may write there.
WRITE_PROBE: dict[str, tuple[str, str, type[Integer] | type[TimeTicks]]] = {
    "ups-mib": ("upsAutoRestart", _AUTO_RESTART, Integer),
    "powernet": ("upsAdvConfigShutoffDelay", _SHUTOFF_DELAY, TimeTicks),
}

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
        # with upsTestSpinLock, read first (see the module docstring)
        "test.battery.start.quick": (Set("upsTestId", TEST_ID, _test(4)),),
        "test.battery.start.deep": (Set("upsTestId", TEST_ID, _test(5)),),
        "test.battery.stop": (Set("upsTestId", TEST_ID, _test(2)),),
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
        "test.battery.start.quick": (Set("upsAdvTestDiagnostics", _APC_DIAGNOSTICS, _fixed(2)),),
        "test.battery.start.deep": (
            Set("upsAdvTestRuntimeCalibration", _APC_CALIBRATION, _fixed(2)),
        ),
        "test.battery.stop": (Set("upsAdvTestRuntimeCalibration", _APC_CALIBRATION, _fixed(3)),),
    },
}
