"""SnmpSource against snmpsim serving UPS-MIB (RFC 1628) and APC PowerNet data, v2c and v3."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.peers.snmpsim import SnmpSim
from upsguard.clock import SystemClock
from upsguard.config.ups import UpsConfig
from upsguard.errors import AuthenticationError, UpsUnreachable
from upsguard.models import LinkState, UpsFlag, UpsReading
from upsguard.plugins.ups.snmp import APC, UPS_MIB, SnmpSource
from upsguard.policies.power import UpsFigures, on_mains
from upsguard.policies.watch import UpsWatch

pytestmark = pytest.mark.snmp


def _read(config: UpsConfig) -> UpsReading:
    async def scenario() -> UpsReading:
        source = SnmpSource(config, SystemClock())
        try:
            return await source.read()
        finally:
            await source.close()

    return asyncio.run(scenario())


def test_ups_mib_on_line_v2c(snmpsim: SnmpSim) -> None:
    reading = _read(snmpsim.ups_config("ups-mib"))
    assert reading.on_line and reading.flags == {UpsFlag.OL}
    assert (reading.charge_pct, reading.runtime_s) == (100.0, 45 * 60.0)
    assert (reading.load_pct, reading.input_voltage) == (38.0, 230.0)


def test_powernet_on_line_v2c(snmpsim: SnmpSim) -> None:
    reading = _read(snmpsim.ups_config("powernet"))
    assert reading.on_line and reading.flags == {UpsFlag.OL}
    assert reading.charge_pct == pytest.approx(100.0)
    assert reading.runtime_s == pytest.approx(42 * 60.0)  # 252000 TimeTicks
    assert (reading.load_pct, reading.input_voltage) == (27.0, 229.0)


@pytest.mark.parametrize("agent", ["ups-mib", "powernet"])
def test_v3_auth_priv_reads(snmpsim: SnmpSim, agent: str) -> None:
    reading = _read(snmpsim.v3_config(agent))
    assert reading.on_line and reading.charge_pct == pytest.approx(100.0)


def test_v3_wrong_key_is_one_clear_line(snmpsim: SnmpSim, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-auth-key\n")
    for config in (
        snmpsim.v3_config("ups-mib", auth_key_file=wrong),
        snmpsim.v3_config("ups-mib", priv_key_file=wrong),
        snmpsim.v3_config("ups-mib", user="nobody"),
    ):
        with pytest.raises(AuthenticationError) as info:
            _read(config)
        message = str(info.value)
        assert "\n" not in message and "snmp-ups-mib" in message and "refused" in message
        assert "not-the-auth-key" not in message


def test_wrong_community_times_out_with_a_clear_line(snmpsim: SnmpSim) -> None:
    with pytest.raises(UpsUnreachable) as info:
        _read(snmpsim.ups_config("ups-mib", community="nobody", timeout="0.5s", retries=0))
    assert "community" in str(info.value) and "\n" not in str(info.value)


def test_ups_mib_outage_values_changed_during_the_test_are_seen(snmpsim: SnmpSim) -> None:
    config = snmpsim.ups_config("ups-mib")

    async def scenario() -> list[UpsReading]:
        clock = SystemClock()
        watch = UpsWatch(SnmpSource(config, clock), clock)
        seen = [await watch.poll()]
        snmpsim.set(
            "ups-mib",
            {
                f"{UPS_MIB}.4.1.0": (2, 5),  # upsOutputSource battery
                f"{UPS_MIB}.2.2.0": (2, 30),  # upsSecondsOnBattery
                f"{UPS_MIB}.2.3.0": (2, 20),
                f"{UPS_MIB}.2.4.0": (2, 70),
                f"{UPS_MIB}.3.3.1.3.1": (2, 0),
            },
        )
        seen.append(await watch.poll())
        snmpsim.set(
            "ups-mib",
            {
                f"{UPS_MIB}.2.1.0": (2, 3),  # batteryLow
                f"{UPS_MIB}.2.4.0": (2, 15),
                f"{UPS_MIB}.6.1.0": (66, 1),  # one alarm present
                f"{UPS_MIB}.6.2.1.2.1": (6, f"{UPS_MIB}.6.3.3"),  # upsAlarmLowBattery
            },
        )
        seen.append(await watch.poll())
        await watch.source.close()
        return seen

    before, outage, low = asyncio.run(scenario())
    assert before.on_line
    assert outage.flags == {UpsFlag.OB, UpsFlag.DISCHRG} and outage.charge_pct == 70.0
    assert outage.raw["upsSecondsOnBattery"] == "30"
    assert low.low_battery and UpsFlag.ALARM in low.flags and low.charge_pct == 15.0


def test_seconds_on_battery_left_from_an_earlier_outage_is_not_on_battery(
    snmpsim: SnmpSim,
) -> None:
    snmpsim.set("ups-mib", {f"{UPS_MIB}.2.2.0": (2, 4000)})
    reading = _read(snmpsim.ups_config("ups-mib"))
    assert reading.on_line and not reading.on_battery
    assert "upsSecondsOnBattery" not in reading.raw


def test_powernet_battery_test_is_not_an_outage(snmpsim: SnmpSim) -> None:
    snmpsim.set("powernet", {f"{APC}.4.1.1.0": (2, 15)})  # onBatteryTest
    reading = _read(snmpsim.ups_config("powernet"))
    assert reading.flags == {UpsFlag.OB, UpsFlag.CAL}
    assert on_mains(reading)
    assert UpsFigures(reading, reading.runtime_s, None).supplying


def test_powernet_on_battery_and_high_precision_charge(snmpsim: SnmpSim) -> None:
    snmpsim.set(
        "powernet",
        {
            f"{APC}.4.1.1.0": (2, 3),  # onBattery
            f"{APC}.2.1.1.0": (2, 3),  # batteryLow
            f"{APC}.2.3.1.0": (66, 87),  # 8.7 %
            f"{APC}.2.2.3.0": (67, 9000),  # 90 s
        },
    )
    reading = _read(snmpsim.ups_config("powernet"))
    assert reading.flags == {UpsFlag.OB, UpsFlag.DISCHRG, UpsFlag.LB}
    assert reading.charge_pct == pytest.approx(8.7)
    assert reading.runtime_s == pytest.approx(90.0)


def test_agent_gone_reads_lost_with_last_values(snmpsim: SnmpSim) -> None:
    config = snmpsim.ups_config("ups-mib", timeout="0.3s", retries=0)

    async def scenario() -> UpsReading:
        clock = SystemClock()
        watch = UpsWatch(SnmpSource(config, clock), clock)
        await watch.poll()
        snmpsim.stop()
        lost = await watch.poll()
        await watch.source.close()
        return lost

    lost = asyncio.run(scenario())
    assert lost.link is LinkState.LOST and not lost.on_line and lost.charge_pct == 100.0
