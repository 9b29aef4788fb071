"""The wol platform against a loopback Wake-on-LAN network (tests/peers/wol.py).

The listener checks each magic packet byte by byte and, for a MAC it knows,
opens the woken host's check port on its own loopback address (127.0.0.x).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from tests.peers.wol import WolNetwork, parse_magic
from upsguard.clock import SystemClock
from upsguard.config.platforms import WolSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError
from upsguard.models import PlatformName, PowerState, StopMethod
from upsguard.plugins import catalog
from upsguard.plugins.platforms.wol import magic_packet

MAC_A, MAC_B = "52:54:00:aa:00:01", "52-54-00-AA-00-02"


def platform(network: WolNetwork) -> Any:
    settings = WolSettings.model_validate(
        {
            "type": "wol",
            "broadcast": "127.0.0.1",
            "port": network.port,
            "check_port": network.check_port,
            "poll_interval": "0.1s",
        }
    )
    return catalog.load("platform", "wol")(PlatformName("wol"), settings, SystemClock())


def box(name: str, address: str, mac: str | None) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": name, "kind": "host", "platform": "ssh", "host": address, "mac": mac}
    )


def test_wakes_the_named_host_and_sees_it_answer(wol_network: WolNetwork) -> None:
    wol_network.add_host(MAC_A, "127.0.0.2", boot_delay=0.4)
    wol_network.add_host(MAC_B, "127.0.0.3", boot_delay=0.0)

    async def scenario() -> tuple[PowerState, bool, PowerState]:
        wol = platform(wol_network)
        [a] = await wol.resolve(box("pve1", "127.0.0.2", MAC_A))
        [b] = await wol.resolve(box("pve2", "127.0.0.3", MAC_B))
        before = await wol.power_state(a)
        await wol.start(a)
        up = await wol.wait_for(a, PowerState.ON, 10)
        return before, up, await wol.power_state(b)

    # a box that does not answer may be off or out of reach: unknown, and woken all the same
    assert asyncio.run(scenario()) == (PowerState.UNKNOWN, True, PowerState.UNKNOWN)
    assert set(wol_network.woken) == {MAC_A} and len(wol_network.woken) == 3
    assert wol_network.malformed == 0


def test_a_host_that_does_not_wake_times_out(wol_network: WolNetwork) -> None:
    async def scenario() -> bool:
        wol = platform(wol_network)
        [target] = await wol.resolve(box("old-nas", "127.0.0.4", "52:54:00:aa:00:09"))
        await wol.start(target)
        reached: bool = await wol.wait_for(target, PowerState.ON, 0.5)
        return reached

    assert asyncio.run(scenario()) is False
    assert wol_network.woken[0] == "52:54:00:aa:00:09"


def test_a_resource_without_mac_is_refused_by_name(wol_network: WolNetwork) -> None:
    with pytest.raises(PermanentError, match=r"resource 'pve3': Wake-on-LAN needs its MAC"):
        asyncio.run(platform(wol_network).resolve(box("pve3", "127.0.0.5", None)))
    with pytest.raises(ValidationError, match="not a MAC address: '52:54:00'"):
        box("pve3", "127.0.0.5", "52:54:00")  # the site file refuses it, before any run


def test_it_cannot_stop_anything(wol_network: WolNetwork) -> None:
    async def scenario() -> None:
        wol = platform(wol_network)
        [target] = await wol.resolve(box("pve1", "127.0.0.2", MAC_A))
        await wol.stop(target, StopMethod.GRACEFUL)

    with pytest.raises(PermanentError, match=r"can only wake 127\.0\.0\.2"):
        asyncio.run(scenario())


def test_magic_packet_layout() -> None:
    packet = magic_packet(MAC_B)
    assert len(packet) == 102 and packet[:6] == b"\xff" * 6
    assert parse_magic(packet) == "52:54:00:aa:00:02"
