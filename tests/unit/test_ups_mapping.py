"""From NUT variables and SNMP values to one normalized reading.

The NUT variables are those NUT documents for ``upsc`` (docs/nut-names.txt); the SNMP values
follow RFC 1628 (UPS-MIB) and APC's PowerNet-MIB enumerations. The same mappings are
exercised end to end against upsd and snmpsim in tests/integration.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from upsguard.models import LinkState, UpsFlag, UpsName
from upsguard.plugins.ups.nut import parse_status, reading_from_vars
from upsguard.plugins.ups.snmp import UPS_MIB, powernet_reading, ups_mib_reading

AT = datetime(2026, 1, 1, tzinfo=UTC)
UPS = UpsName("u")


def test_nut_status_words() -> None:
    flags, unknown = parse_status("OB DISCHRG LB ECO")
    assert flags == {UpsFlag.OB, UpsFlag.DISCHRG, UpsFlag.LB}
    assert unknown == ["ECO"]


def test_nut_variables() -> None:
    reading = reading_from_vars(
        UPS,
        AT,
        {
            "ups.status": "OL CHRG",
            "battery.charge": "87",
            "battery.runtime": "1520",
            "ups.load": "23",
            "input.voltage": "229.5",
        },
    )
    assert reading.on_line and UpsFlag.CHRG in reading.flags
    assert (reading.charge_pct, reading.runtime_s, reading.load_pct) == (87.0, 1520.0, 23.0)
    assert reading.input_voltage == 229.5


@pytest.mark.parametrize("status", ["WAIT", ""])
def test_nut_wait_or_no_status_is_stale(status: str) -> None:
    assert reading_from_vars(UPS, AT, {"ups.status": status}).link is LinkState.STALE


def test_nut_garbage_numbers_are_unknown() -> None:
    reading = reading_from_vars(UPS, AT, {"ups.status": "OL", "battery.charge": "n/a"})
    assert reading.charge_pct is None


@pytest.mark.parametrize(
    ("source", "flags"),
    [
        (3, {UpsFlag.OL}),
        (5, {UpsFlag.OB, UpsFlag.DISCHRG}),
        (4, {UpsFlag.OL, UpsFlag.BYPASS}),
        (6, {UpsFlag.OL, UpsFlag.BOOST}),
        (7, {UpsFlag.OL, UpsFlag.TRIM}),
        (2, {UpsFlag.OFF}),
    ],
)
def test_ups_mib_output_source(source: int, flags: set[UpsFlag]) -> None:
    assert ups_mib_reading(UPS, AT, {"upsOutputSource": source}, ()).flags == flags


def test_ups_mib_alarms_and_test_in_progress() -> None:
    values = {"upsOutputSource": 5, "upsAlarmsPresent": 2, "upsTestResultsSummary": 5}
    alarms = [f"{UPS_MIB}.6.3.8", f"{UPS_MIB}.6.3.1"]  # overload, battery bad
    reading = ups_mib_reading(UPS, AT, values, alarms)
    assert {UpsFlag.ALARM, UpsFlag.OVER, UpsFlag.RB, UpsFlag.CAL} <= reading.flags


def test_ups_mib_seconds_on_battery_only_while_on_battery() -> None:
    on_line = ups_mib_reading(UPS, AT, {"upsOutputSource": 3, "upsSecondsOnBattery": 900}, ())
    on_battery = ups_mib_reading(UPS, AT, {"upsOutputSource": 5, "upsSecondsOnBattery": 9}, ())
    assert not on_line.on_battery and "upsSecondsOnBattery" not in on_line.raw
    assert on_battery.raw["upsSecondsOnBattery"] == "9"


def test_powernet_runtime_ticks_and_charge() -> None:
    values = {
        "upsBasicOutputStatus": 12,
        "upsAdvBatteryCapacity": 97,
        "upsAdvBatteryRunTimeRemaining": 123400,
        "upsAdvBatteryReplaceIndicator": 2,
        "upsAdvOutputLoad": 104,
    }
    reading = powernet_reading(UPS, AT, values)
    assert reading.flags == {UpsFlag.OL, UpsFlag.TRIM, UpsFlag.RB, UpsFlag.OVER}
    assert reading.charge_pct == 97.0 and reading.runtime_s == pytest.approx(1234.0)
