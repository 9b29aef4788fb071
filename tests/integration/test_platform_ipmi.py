"""The ipmi platform against a real IPMI 2.0 server on loopback: pyghmi's BMC (peers/bmc.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.peers.bmc import FakeBmc
from upsguard.clock import SystemClock
from upsguard.config.platforms import IpmiSettings
from upsguard.config.resources import ResourceConfig
from upsguard.engine.health import wait_healthy
from upsguard.errors import AuthenticationError, PlatformUnreachable
from upsguard.models import PlatformName, PowerState, StopMethod
from upsguard.plugins import catalog
from upsguard.plugins.platforms.base import Platform

HOST = ResourceConfig.model_validate(
    {"id": "esx01", "kind": "host", "platform": "vcenter", "power_on_via": "bmc-esx01"}
)


def platform(bmc: FakeBmc, **extra: Any) -> Platform:
    settings = IpmiSettings.model_validate(bmc.settings_dict(poll_interval="0.1s", **extra))
    cls = catalog.load("platform", "ipmi")
    made: Platform = cls(PlatformName("bmc-esx01"), settings, SystemClock())
    return made


def test_powers_a_host_on_and_sees_it_on(fake_bmc_factory: Callable[..., FakeBmc]) -> None:
    bmc = fake_bmc_factory(power="off", power_on_delay=0.5)

    async def scenario() -> tuple[PowerState, bool, PowerState]:
        bmc_platform = platform(bmc)
        await bmc_platform.open()
        try:
            [target] = await bmc_platform.resolve(HOST)
            before = await bmc_platform.power_state(target)
            await bmc_platform.start(target)
            reached = await bmc_platform.wait_for(target, PowerState.ON, 10)
            return before, reached, await bmc_platform.power_state(target)
        finally:
            await bmc_platform.close()

    assert asyncio.run(scenario()) == (PowerState.OFF, True, PowerState.ON)
    assert bmc.actions() == ["on"]


def test_graceful_stop_is_a_soft_off(fake_bmc_factory: Callable[..., FakeBmc]) -> None:
    bmc = fake_bmc_factory(power="on", soft_off_delay=0.3)

    async def scenario() -> bool:
        bmc_platform = platform(bmc)
        [target] = await bmc_platform.resolve(HOST)
        await bmc_platform.stop(target, StopMethod.GRACEFUL)
        reached = await bmc_platform.wait_for(target, PowerState.OFF, 10)
        await bmc_platform.close()
        return reached

    assert asyncio.run(scenario()) is True
    assert bmc.actions() == ["softoff"]


def test_hung_os_is_powered_off_hard_after_the_soft_off_times_out(
    fake_bmc_factory: Callable[..., FakeBmc],
) -> None:
    """What the executor's fallback does: soft off, wait guest_timeout, then hard off."""
    bmc = fake_bmc_factory(power="on", ignore_soft_off=True)

    async def scenario() -> tuple[bool, bool]:
        bmc_platform = platform(bmc)
        [target] = await bmc_platform.resolve(HOST)
        await bmc_platform.stop(target, StopMethod.GRACEFUL)
        soft = await bmc_platform.wait_for(target, PowerState.OFF, 0.5)
        await bmc_platform.stop(target, StopMethod.HARD)
        hard = await bmc_platform.wait_for(target, PowerState.OFF, 5)
        await bmc_platform.close()
        return soft, hard

    assert asyncio.run(scenario()) == (False, True)
    assert bmc.actions() == ["softoff", "off"]


def test_wrong_password_is_an_authentication_error_without_the_secret(
    fake_bmc_factory: Callable[..., FakeBmc], tmp_path: Any
) -> None:
    bmc = fake_bmc_factory(password="right-one")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    bmc_platform = platform(bmc, password_file=str(wrong))
    with pytest.raises(AuthenticationError) as err:
        asyncio.run(bmc_platform.open())
    message = str(err.value)
    assert "bmc-esx01" in message and "admin" in message
    assert "not-the-password" not in message and "right-one" not in message
    assert bmc.actions() == []


def test_password_from_an_environment_variable(
    fake_bmc_factory: Callable[..., FakeBmc], monkeypatch: pytest.MonkeyPatch
) -> None:
    bmc = fake_bmc_factory(power="on", password="from-env")
    monkeypatch.setenv("BMC_PW", "from-env")
    settings = bmc.settings_dict(poll_interval="0.1s", password_env="BMC_PW")
    del settings["password_file"]
    bmc_platform = catalog.load("platform", "ipmi")(
        PlatformName("bmc"), IpmiSettings.model_validate(settings), SystemClock()
    )

    async def scenario() -> PowerState:
        [target] = await bmc_platform.resolve(HOST)
        state: PowerState = await bmc_platform.power_state(target)
        await bmc_platform.close()
        return state

    assert asyncio.run(scenario()) is PowerState.ON


def test_startup_waits_for_the_chassis_before_dependents(
    fake_bmc_factory: Callable[..., FakeBmc],
) -> None:
    bmc = fake_bmc_factory(power="off", power_on_delay=0.8)

    async def scenario() -> None:
        bmc_platform = platform(bmc)
        [target] = await bmc_platform.resolve(HOST)
        await bmc_platform.start(target)
        await wait_healthy(
            ResourceConfig.model_validate(
                {**HOST.model_dump(exclude_none=True), "health": {"interval": "0.1s"}}
            ),
            target,
            bmc_platform,
        )
        assert await bmc_platform.power_state(target) is PowerState.ON
        await bmc_platform.close()

    asyncio.run(scenario())


def test_silent_bmc_is_unreachable_and_named(tmp_path: Any) -> None:
    import socket

    from tests.peers.ports import free_port

    pw = tmp_path / "pw"
    pw.write_text("x")
    settings = IpmiSettings.model_validate(
        {
            "type": "ipmi",
            "host": "127.0.0.1",
            "port": free_port(socket.SOCK_DGRAM),
            "user": "admin",
            "password_file": str(pw),
        }
    )
    bmc_platform = catalog.load("platform", "ipmi")(
        PlatformName("bmc-gone"), settings, SystemClock()
    )
    with pytest.raises(PlatformUnreachable, match=r"BMC 'bmc-gone' \(127\.0\.0\.1:\d+\)"):
        asyncio.run(bmc_platform.open())
