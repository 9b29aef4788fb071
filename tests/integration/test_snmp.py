"""SnmpSource against snmpsim serving UPS-MIB (RFC 1628) and APC PowerNet data, v2c and v3:
readings, and the commands at the end of a shutdown as SETs read back at the agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.peers.snmpsim import SnmpSim
from upsguard.clock import SystemClock
from upsguard.config.ups import UpsCommandPolicy, UpsConfig
from upsguard.errors import AuthenticationError, PermanentError, UpsUnreachable
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


# -- commands over SNMP SET ------------------------------------------------------------------

SHUTDOWN_AFTER = f"{UPS_MIB}.8.2.0"  # upsShutdownAfterDelay, seconds
STARTUP_AFTER = f"{UPS_MIB}.8.3.0"  # upsStartupAfterDelay, seconds
AUTO_RESTART = f"{UPS_MIB}.8.5.0"  # upsAutoRestart on(1) off(2)
SHUTOFF_DELAY = f"{APC}.5.2.10.0"  # upsAdvConfigShutoffDelay, TimeTicks
UPS_OFF = f"{APC}.6.2.1.0"  # upsAdvControlUpsOff
REBOOT = f"{APC}.6.2.2.0"  # upsAdvControlRebootShutdownUps


def _command(config: UpsConfig, name: str) -> None:
    async def scenario() -> None:
        source = SnmpSource(config, SystemClock())
        try:
            await source.command(name)
        finally:
            await source.close()

    asyncio.run(scenario())


def _with_delay(config: UpsConfig, command: str, delay: str) -> UpsConfig:
    policy = UpsCommandPolicy.model_validate({"command": command, "delay": delay})
    return config.model_copy(update={"at_shutdown_end": policy})


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # off after the delay, and started again 30 s later (only once mains is back: RFC 1628)
        ("shutdown.return", {SHUTDOWN_AFTER: 150, STARTUP_AFTER: 180, AUTO_RESTART: 1}),
        # off after the delay, and no restart when mains comes back
        ("shutdown.stayoff", {SHUTDOWN_AFTER: 150, STARTUP_AFTER: -1, AUTO_RESTART: 2}),
        ("load.off.delay", {SHUTDOWN_AFTER: 150, STARTUP_AFTER: -1, AUTO_RESTART: 1}),
        ("load.off", {SHUTDOWN_AFTER: 0, STARTUP_AFTER: -1, AUTO_RESTART: 1}),
    ],
)
def test_ups_mib_commands_are_sets_read_back_at_the_agent(
    snmpsim: SnmpSim, command: str, expected: dict[str, int]
) -> None:
    _command(_with_delay(snmpsim.ups_config("ups-mib"), command, "150s"), command)
    assert snmpsim.get("ups-mib", *expected) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # rebootShutdownUpsGracefully(3): off after the shutoff delay, on when mains is good
        ("shutdown.return", {SHUTOFF_DELAY: 15000, UPS_OFF: 1, REBOOT: 3}),
        # turnUpsOffGracefully(3): off after the shutoff delay whatever the input line does
        ("shutdown.stayoff", {SHUTOFF_DELAY: 15000, UPS_OFF: 3, REBOOT: 1}),
        ("load.off.delay", {SHUTOFF_DELAY: 15000, UPS_OFF: 3, REBOOT: 1}),
        ("load.off", {SHUTOFF_DELAY: 2000, UPS_OFF: 2, REBOOT: 1}),  # turnUpsOff(2), now
    ],
)
def test_powernet_commands_are_sets_read_back_at_the_agent(
    snmpsim: SnmpSim, command: str, expected: dict[str, int]
) -> None:
    _command(_with_delay(snmpsim.ups_config("powernet"), command, "150s"), command)
    assert snmpsim.get("powernet", *expected) == expected


TEST_ID = f"{UPS_MIB}.7.1.0"  # upsTestId: the test asked for
TESTS = f"{UPS_MIB}.7.7"  # upsWellKnownTests
DIAGNOSTICS = f"{APC}.7.2.2.0"  # upsAdvTestDiagnostics: testDiagnostics(2)
CALIBRATION = f"{APC}.7.2.5.0"  # upsAdvTestRuntimeCalibration: perform(2), cancel(3)


@pytest.mark.parametrize(
    ("agent", "command", "expected"),
    [
        # RFC 1628: upsTestId set to a well-known test (with the spin lock just read)
        ("ups-mib", "test.battery.start.quick", {TEST_ID: f"{TESTS}.4"}),
        ("ups-mib", "test.battery.start.deep", {TEST_ID: f"{TESTS}.5"}),
        ("ups-mib", "test.battery.stop", {TEST_ID: f"{TESTS}.2"}),
        # PowerNet: a self-test is a diagnostics run; a deep test, a runtime calibration
        ("powernet", "test.battery.start.quick", {DIAGNOSTICS: 2}),
        ("powernet", "test.battery.start.deep", {CALIBRATION: 2}),
        ("powernet", "test.battery.stop", {CALIBRATION: 3}),
    ],
)
def test_battery_tests_are_sets_read_back_at_the_agent(
    snmpsim: SnmpSim, agent: str, command: str, expected: dict[str, object]
) -> None:
    """The scheduled battery test over SNMP (``battery_test:``), as the agent received it."""
    _command(snmpsim.ups_config(agent), command)
    assert snmpsim.get(agent, *expected) == expected


def test_commands_go_over_v3_too(snmpsim: SnmpSim) -> None:
    config = _with_delay(snmpsim.v3_config("ups-mib"), "shutdown.return", "2m")
    _command(config, "shutdown.return")
    assert snmpsim.get("ups-mib", SHUTDOWN_AFTER) == {SHUTDOWN_AFTER: 120}


def test_a_command_the_mib_cannot_do_is_refused_naming_both(snmpsim: SnmpSim) -> None:
    with pytest.raises(PermanentError) as info:
        _command(snmpsim.ups_config("powernet"), "beeper.disable")
    message = str(info.value)
    assert "beeper.disable" in message and "powernet" in message and "\n" not in message
    assert snmpsim.get("powernet", UPS_OFF) == {UPS_OFF: 1}


def test_an_agent_that_refuses_the_set_is_a_permanent_error_and_nothing_follows(
    snmpsim: SnmpSim,
) -> None:
    # a card whose upsAutoRestart is not writable: stayoff must not go on to cut the power
    snmpsim.set("ups-mib", {AUTO_RESTART: ("2:writecache", "value=1,status=notwritable,op=set")})
    with pytest.raises(PermanentError) as info:
        _command(
            _with_delay(snmpsim.ups_config("ups-mib"), "shutdown.stayoff", "2m"), "shutdown.stayoff"
        )
    message = str(info.value)
    assert "shutdown.stayoff" in message and "upsAutoRestart" in message
    assert "notWritable" in message and "\n" not in message
    assert snmpsim.get("ups-mib", SHUTDOWN_AFTER) == {SHUTDOWN_AFTER: -1}


def test_command_to_an_agent_gone_is_unreachable(snmpsim: SnmpSim) -> None:
    config = snmpsim.ups_config("ups-mib", timeout="0.3s", retries=0)
    snmpsim.stop()
    with pytest.raises(UpsUnreachable):
        _command(config, "load.off")
