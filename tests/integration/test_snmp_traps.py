"""Traps from SNMP UPSes: real SNMPv1/v2c/v3 traps sent over UDP on loopback with pysnmp.

A trap is a change only when it comes from the UPS's own address, with the community or SNMPv3
user of the polls, and is one of the traps that announce a change (UPS-MIB upsTraps, PowerNet
upsOnBattery, powerRestored, ...). The service polls at once on a change: with a poll interval of
an hour, an outage seen right after a trap was seen because of it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    NotificationType,
    ObjectIdentity,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    send_notification,
    usmAesCfb128Protocol,
    usmHMACSHAAuthProtocol,
)
from pysnmp.proto.rfc1902 import OctetString

from tests.peers.ports import free_port
from tests.peers.service import ServiceProcess, write_site
from tests.peers.snmpsim import (
    ENGINE_ID,
    V3_AUTH_KEY,
    V3_PRIV_KEY,
    V3_USER,
    SnmpSim,
    udp_bound,
)
from upsguard.clock import SystemClock
from upsguard.config.site import SiteConfig
from upsguard.config.ups import UpsConfig
from upsguard.controller.service import Service
from upsguard.errors import UpsguardError
from upsguard.plugins.ups.snmp import UPS_MIB, SnmpSource

pytestmark = pytest.mark.snmp

ON_BATTERY = "1.3.6.1.2.1.33.2.1"  # UPS-MIB upsTrapOnBattery (SNMPv2 form)
ON_BATTERY_V1 = "1.3.6.1.2.1.33.2.0.1"  # the same sent as an SNMPv1 trap (RFC 3584)
TEST_COMPLETED = "1.3.6.1.2.1.33.2.2"  # UPS-MIB upsTrapTestCompleted
APC_ON_BATTERY = "1.3.6.1.4.1.318.0.5"  # PowerNet upsOnBattery (an SNMPv1 trap)
APC_POWER_RESTORED = "1.3.6.1.4.1.318.0.9"  # PowerNet powerRestored
COLD_START = "1.3.6.1.6.3.1.1.5.1"  # SNMPv2-MIB coldStart: says nothing about the power


def v3_user(auth_key: str = V3_AUTH_KEY) -> UsmUserData:
    return UsmUserData(
        V3_USER,
        auth_key,
        V3_PRIV_KEY,
        authProtocol=usmHMACSHAAuthProtocol,
        privProtocol=usmAesCfb128Protocol,
    )


async def send_trap(
    port: int,
    auth: CommunityData | UsmUserData,
    trap: str,
    sender: str = "127.0.0.1",
) -> None:
    """One trap to ``port`` from ``sender``, as the UPS's own SNMP engine sends it."""
    engine = SnmpEngine(snmpEngineID=OctetString(hexValue=ENGINE_ID))
    try:
        target = await UdpTransportTarget.create(("127.0.0.1", port))
        target.set_local_address((sender, 0))
        error, *_ = await send_notification(
            engine, auth, target, ContextData(), "trap", NotificationType(ObjectIdentity(trap))
        )
        assert error is None, error
    finally:
        engine.close_dispatcher()


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check`` (a guard of 30 s against a hang, never a measure)."""
    try:
        async with asyncio.timeout(30):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


class Changes:
    """What a source announced, counted, with an event for the test to wait on."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def watching(
    config: UpsConfig, scenario: Callable[[SnmpSource, Changes, int], Awaitable[None]]
) -> None:
    """Run ``scenario`` while the source watches for changes on its trap port (bound first)."""
    source = SnmpSource(config, SystemClock())
    changes = Changes()
    assert config.snmp is not None and config.snmp.trap_port is not None
    port = config.snmp.trap_port
    task = asyncio.create_task(source.watch_for_changes(changes))
    try:
        await until(lambda: udp_bound(port) or task.done(), f"the trap port {port}")
        if task.done():
            task.result()
        await scenario(source, changes, port)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()


def listening(config: UpsConfig, port: int | None = None) -> UpsConfig:
    assert config.snmp is not None
    snmp = config.snmp.model_copy(
        update={"trap_port": port or free_port(socket.SOCK_DGRAM), "trap_address": "127.0.0.1"}
    )
    return config.model_copy(update={"snmp": snmp})


@pytest.mark.parametrize(
    ("agent", "mp_model", "trap"),
    [
        ("ups-mib", 1, ON_BATTERY),
        ("ups-mib", 1, TEST_COMPLETED),
        ("ups-mib", 0, ON_BATTERY_V1),
        ("powernet", 0, APC_ON_BATTERY),
        ("powernet", 0, APC_POWER_RESTORED),
    ],
)
def test_a_v1_or_v2c_trap_from_the_ups_is_a_change(
    snmpsim: SnmpSim, agent: str, mp_model: int, trap: str
) -> None:
    async def scenario(source: SnmpSource, changes: Changes, port: int) -> None:
        await send_trap(port, CommunityData(agent, mpModel=mp_model), trap)
        await until(lambda: changes.count == 1, "the trap's change")

    asyncio.run(watching(listening(snmpsim.ups_config(agent)), scenario))


def test_traps_with_the_wrong_community_host_or_kind_are_not_changes(snmpsim: SnmpSim) -> None:
    async def scenario(source: SnmpSource, changes: Changes, port: int) -> None:
        await send_trap(port, CommunityData("public"), ON_BATTERY)
        await send_trap(port, CommunityData("ups-mib"), ON_BATTERY, sender="127.0.0.2")
        await send_trap(port, CommunityData("ups-mib"), COLD_START)
        await send_trap(port, CommunityData("ups-mib"), ON_BATTERY)  # the one that counts
        await until(lambda: changes.count >= 1, "the good trap's change")
        # one socket, read in order: everything sent before the good trap was judged already
        assert changes.count == 1

    asyncio.run(watching(listening(snmpsim.ups_config("ups-mib")), scenario))


def test_two_ups_share_one_trap_port_and_each_hears_only_its_own(snmpsim: SnmpSim) -> None:
    port = free_port(socket.SOCK_DGRAM)
    a = listening(snmpsim.ups_config("ups-mib"), port)
    b_settings = snmpsim.ups_config("powernet").snmp
    assert b_settings is not None
    b = listening(
        UpsConfig.model_validate(
            {"name": "ups-b", "snmp": {**b_settings.model_dump(), "host": "127.0.0.2"}}
        ),
        port,
    )

    async def scenario(source: SnmpSource, changes_a: Changes, _: int) -> None:
        other = SnmpSource(b, SystemClock())
        changes_b = Changes()
        task = asyncio.create_task(other.watch_for_changes(changes_b))
        try:
            await send_trap(port, CommunityData("powernet", mpModel=0), APC_ON_BATTERY, "127.0.0.2")
            await until(lambda: changes_b.count == 1, "ups-b's changes")
            await send_trap(port, CommunityData("ups-mib"), ON_BATTERY)
            await until(lambda: changes_a.count == 1, "ups-a's changes")
            assert changes_b.count == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await other.close()

    asyncio.run(watching(a, scenario))


def test_a_v3_trap_from_the_ups_engine_is_a_change_once_a_poll_met_that_engine(
    snmpsim: SnmpSim,
) -> None:
    async def scenario(source: SnmpSource, changes: Changes, port: int) -> None:
        await source.read()  # the poll meets the agent's engine (RFC 3414 discovery)
        await send_trap(port, v3_user(auth_key="not-the-auth-key"), ON_BATTERY)
        await send_trap(port, CommunityData("ups-mib"), ON_BATTERY)  # v2c for a v3 UPS
        await send_trap(port, v3_user(), ON_BATTERY)
        await until(lambda: changes.count >= 1, "the v3 trap's change")
        assert changes.count == 1

    asyncio.run(watching(listening(snmpsim.v3_config("ups-mib")), scenario))


def test_a_trap_port_in_use_is_one_clear_line(snmpsim: SnmpSim) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        config = listening(snmpsim.ups_config("ups-mib"), port)

        async def scenario() -> None:
            source = SnmpSource(config, SystemClock())
            try:
                await source.watch_for_changes(Changes())
            finally:
                await source.close()

        with pytest.raises(UpsguardError) as info:
            asyncio.run(scenario())
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "\n" not in message


def test_without_a_trap_port_there_is_nothing_to_watch(snmpsim: SnmpSim) -> None:
    async def scenario() -> None:
        source = SnmpSource(snmpsim.ups_config("ups-mib"), SystemClock())
        await source.watch_for_changes(Changes())  # returns at once

    asyncio.run(scenario())


# -- the service polls at once on changes ------------------------------------------------------


def _site(snmpsim: SnmpSim, trap_port: int, version: str) -> dict[str, Any]:
    snmp: dict[str, Any] = {"host": "127.0.0.1", "port": snmpsim.port, "timeout": "1s"}
    if version == "3":
        snmpsim.v3_config("ups-mib")  # writes the key files
        snmp.update(
            version="3",
            user=V3_USER,
            auth_key_file=str(snmpsim.root / "auth.key"),
            priv_key_file=str(snmpsim.root / "priv.key"),
            context="ups-mib",
        )
    else:
        snmp["community_file"] = str(snmpsim.community_file("ups-mib"))
    snmp.update(trap_port=trap_port, trap_address="127.0.0.1")
    return {
        "site": "traps",
        "ups": [{"name": "ups-a", "snmp": snmp}],
        "resources": [{"id": "core-sw", "kind": "switch"}],
        "policies": {"poll_interval": "1h"},  # only the trap can bring a second poll
    }


@pytest.fixture
def trap_service(tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    started: list[ServiceProcess] = []
    yield started
    for svc in started:
        svc.stop()


def _first_ups(svc: ServiceProcess) -> dict[str, Any]:
    return dict(svc.status()["ups"][0])


@pytest.mark.parametrize("version", ["2c", "3"])
def test_the_service_polls_at_once_on_a_trap(
    snmpsim: SnmpSim, tmp_path: Path, trap_service: list[ServiceProcess], version: str
) -> None:
    port = free_port(socket.SOCK_DGRAM)
    svc = write_site(tmp_path, _site(snmpsim, port, version))
    trap_service.append(svc)
    svc.start()
    svc.wait(lambda: udp_bound(port), f"the service's trap port {port}")
    svc.wait(lambda: _first_ups(svc).get("status") == "OL", "the first poll")
    assert svc.status()["service"]["polls"] == 1

    snmpsim.set("ups-mib", {f"{UPS_MIB}.4.1.0": (2, 5), f"{UPS_MIB}.2.2.0": (2, 12)})
    auth = CommunityData("ups-mib") if version == "2c" else v3_user()
    asyncio.run(send_trap(port, auth, ON_BATTERY))

    svc.wait(lambda: "OB" in _first_ups(svc).get("status", ""), "the outage, seen by a poll")
    assert svc.status()["service"]["polls"] == 2


def test_a_burst_of_changes_is_one_poll(tmp_path: Path) -> None:
    site = SiteConfig.model_validate(
        {
            "site": "burst",
            "journal": str(tmp_path / "journal.sqlite"),
            "service": {"socket": str(tmp_path / "upsguard.sock")},
            "ups": [{"name": "ups1", "simulated": {}}],
            "resources": [{"id": "core-sw", "kind": "switch"}],
            "policies": {"poll_interval": "1h"},
        }
    )

    async def scenario() -> None:
        service = Service(site)
        stop = asyncio.Event()
        try:
            await service.open()
            serving = asyncio.create_task(service.serve(stop))
            await until(lambda: service.ticks == 1, "the first poll")
            for _ in range(5):
                service.request_poll()
            await until(lambda: service.ticks >= 2, "the poll the changes asked for")
            for _ in range(10):  # let anything else that was scheduled run
                await asyncio.sleep(0)
            assert service.ticks == 2
            stop.set()
            await serving
        finally:
            await service.close()

    asyncio.run(scenario())
