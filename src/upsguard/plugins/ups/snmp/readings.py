"""From UPS-MIB and PowerNet values to one normalized reading (NUT's status words).

- the standard UPS-MIB (RFC 1628): ``upsOutputSource`` gives OL/OB/BYPASS/BOOST/TRIM/OFF,
  ``upsBatteryStatus`` low or depleted gives LB, ``upsAlarmsPresent`` > 0 gives ALARM and
  the alarm table refines it (on battery, low battery, overload, replace battery, test in
  progress, shutdown pending);
- APC PowerNet: ``upsBasicOutputStatus`` (on battery test gives OB CAL),
  ``upsBasicBatteryStatus``, ``upsAdvBatteryReplaceIndicator``, charge in tenths of a
  percent when the card has ``upsHighPrecBatteryCapacity``, runtime in TimeTicks.

``upsSecondsOnBattery`` is kept in ``raw`` only while the output source says battery: some
agents leave the count of an earlier outage standing, and a UPS on line is never on battery
because of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pysnmp.proto.rfc1905 import EndOfMibView, NoSuchInstance, NoSuchObject

from upsguard.models import UpsFlag, UpsName, UpsReading

UPS_MIB = "1.3.6.1.2.1.33.1"
UPS_MIB_OIDS = {
    "upsBatteryStatus": f"{UPS_MIB}.2.1.0",
    "upsSecondsOnBattery": f"{UPS_MIB}.2.2.0",
    "upsEstimatedMinutesRemaining": f"{UPS_MIB}.2.3.0",
    "upsEstimatedChargeRemaining": f"{UPS_MIB}.2.4.0",
    "upsInputVoltage.1": f"{UPS_MIB}.3.3.1.3.1",
    "upsOutputSource": f"{UPS_MIB}.4.1.0",
    "upsOutputPercentLoad.1": f"{UPS_MIB}.4.4.1.5.1",
    "upsAlarmsPresent": f"{UPS_MIB}.6.1.0",
    "upsTestResultsSummary": f"{UPS_MIB}.7.3.0",
}
UPS_ALARM_DESCR = f"{UPS_MIB}.6.2.1.2"
_WELL_KNOWN_ALARMS = f"{UPS_MIB}.6.3."
# upsWellKnownAlarms (RFC 1628 section 6.3) that say more than ALARM.
_ALARM_FLAGS = {
    1: UpsFlag.RB,  # upsAlarmBatteryBad
    3: UpsFlag.LB,  # upsAlarmLowBattery
    4: UpsFlag.LB,  # upsAlarmDepletedBattery
    8: UpsFlag.OVER,  # upsAlarmOutputOverload
    22: UpsFlag.FSD,  # upsAlarmShutdownPending
    23: UpsFlag.FSD,  # upsAlarmShutdownImminent
    24: UpsFlag.CAL,  # upsAlarmTestInProgress
}
# upsOutputSource: other(1) none(2) normal(3) bypass(4) battery(5) booster(6) reducer(7)
_OUTPUT_SOURCE = {
    2: {UpsFlag.OFF},
    3: {UpsFlag.OL},
    4: {UpsFlag.OL, UpsFlag.BYPASS},
    5: {UpsFlag.OB, UpsFlag.DISCHRG},
    6: {UpsFlag.OL, UpsFlag.BOOST},
    7: {UpsFlag.OL, UpsFlag.TRIM},
}


APC = "1.3.6.1.4.1.318.1.1.1"
POWERNET_OIDS = {
    "upsBasicBatteryStatus": f"{APC}.2.1.1.0",
    "upsAdvBatteryCapacity": f"{APC}.2.2.1.0",
    "upsAdvBatteryRunTimeRemaining": f"{APC}.2.2.3.0",
    "upsAdvBatteryReplaceIndicator": f"{APC}.2.2.4.0",
    "upsHighPrecBatteryCapacity": f"{APC}.2.3.1.0",
    "upsAdvInputLineVoltage": f"{APC}.3.2.1.0",
    "upsBasicOutputStatus": f"{APC}.4.1.1.0",
    "upsAdvOutputLoad": f"{APC}.4.2.3.0",
}
# upsBasicOutputStatus, PowerNet-MIB.
_APC_OUTPUT = {
    2: {UpsFlag.OL},  # onLine
    3: {UpsFlag.OB, UpsFlag.DISCHRG},  # onBattery
    4: {UpsFlag.OL, UpsFlag.BOOST},  # onSmartBoost
    5: {UpsFlag.OFF},  # timedSleeping
    6: {UpsFlag.OL, UpsFlag.BYPASS},  # softwareBypass
    7: {UpsFlag.OFF},  # off
    9: {UpsFlag.OL, UpsFlag.BYPASS},  # switchedBypass
    10: {UpsFlag.OL, UpsFlag.BYPASS, UpsFlag.ALARM},  # hardwareFailureBypass
    11: {UpsFlag.OFF},  # sleepingUntilPowerReturn
    12: {UpsFlag.OL, UpsFlag.TRIM},  # onSmartTrim
    13: {UpsFlag.OL},  # ecoMode
    14: {UpsFlag.OL},  # hotStandby
    15: {UpsFlag.OB, UpsFlag.CAL},  # onBatteryTest
    16: {UpsFlag.OL, UpsFlag.BYPASS},  # emergencyStaticBypass
    18: {UpsFlag.OL},  # powerSavingMode
    20: {UpsFlag.OL},  # eConversion
}


def snmp_value(value: Any) -> int | str | None:
    if isinstance(value, NoSuchObject | NoSuchInstance | EndOfMibView) or value is None:
        return None
    if value.__class__.__name__ in ("NoSuchObject", "NoSuchInstance", "EndOfMibView"):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value.prettyPrint() if hasattr(value, "prettyPrint") else value)


def _num(value: int | str | None, scale: float = 1.0) -> float | None:
    return float(value) * scale if isinstance(value, int) else None


def ups_mib_reading(
    ups: UpsName, at: datetime, v: Mapping[str, int | str | None], alarms: Sequence[Any]
) -> UpsReading:
    """Normalize RFC 1628 values; ``alarms`` are the upsAlarmDescr OIDs (as text)."""
    source = v.get("upsOutputSource")
    flags = set(_OUTPUT_SOURCE.get(source, set()) if isinstance(source, int) else set())
    if v.get("upsBatteryStatus") in (3, 4):  # batteryLow, batteryDepleted
        flags.add(UpsFlag.LB)
    if v.get("upsTestResultsSummary") == 5:  # inProgress
        flags.add(UpsFlag.CAL)
    present = v.get("upsAlarmsPresent")
    if isinstance(present, int) and present > 0:
        flags.add(UpsFlag.ALARM)
    for alarm in alarms:
        text = str(alarm)
        if text.startswith(_WELL_KNOWN_ALARMS):
            flag = _ALARM_FLAGS.get(int(text[len(_WELL_KNOWN_ALARMS) :].split(".")[0]))
            if flag is not None:
                flags.add(flag)
    raw = {k: str(val) for k, val in v.items() if val is not None}
    if UpsFlag.OB not in flags:
        raw.pop("upsSecondsOnBattery", None)  # left over from an earlier outage
    raw["alarms"] = " ".join(str(a) for a in alarms)
    return UpsReading(
        ups=ups,
        at=at,
        flags=frozenset(flags),
        charge_pct=_num(v.get("upsEstimatedChargeRemaining")),
        runtime_s=_num(v.get("upsEstimatedMinutesRemaining"), 60.0),
        load_pct=_num(v.get("upsOutputPercentLoad.1")),
        input_voltage=_num(v.get("upsInputVoltage.1")),
        raw=raw,
    )


def powernet_reading(ups: UpsName, at: datetime, v: Mapping[str, int | str | None]) -> UpsReading:
    """Normalize APC PowerNet values (runtime TimeTicks are hundredths of a second)."""
    status = v.get("upsBasicOutputStatus")
    flags = set(_APC_OUTPUT.get(status, set()) if isinstance(status, int) else set())
    battery = v.get("upsBasicBatteryStatus")
    if battery == 3:  # batteryLow
        flags.add(UpsFlag.LB)
    if battery == 4:  # batteryInFaultCondition
        flags |= {UpsFlag.RB, UpsFlag.ALARM}
    if v.get("upsAdvBatteryReplaceIndicator") == 2:  # batteryNeedsReplacing
        flags.add(UpsFlag.RB)
    load = _num(v.get("upsAdvOutputLoad"))
    if load is not None and load > 100:
        flags.add(UpsFlag.OVER)
    charge = _num(v.get("upsHighPrecBatteryCapacity"), 0.1)
    if charge is None:
        charge = _num(v.get("upsAdvBatteryCapacity"))
    return UpsReading(
        ups=ups,
        at=at,
        flags=frozenset(flags),
        charge_pct=charge,
        runtime_s=_num(v.get("upsAdvBatteryRunTimeRemaining"), 0.01),
        load_pct=load,
        input_voltage=_num(v.get("upsAdvInputLineVoltage")),
        raw={k: str(val) for k, val in v.items() if val is not None},
    )
