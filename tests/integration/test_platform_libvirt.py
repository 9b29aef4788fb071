"""The libvirt platform against libvirt's own test driver (test:///default), via libvirt-python.

The test driver answers the real API but shuts guests down at once and has no
guest agent, so the agent wait is exercised only as "driver cannot tell".
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.peers.libvirt import LibvirtDomains
from tests.peers.ports import free_port
from upsguard.clock import SystemClock
from upsguard.config.platforms import LibvirtSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, PlatformUnreachable
from upsguard.models import PlatformName, PowerState, ResourceKind, StopMethod
from upsguard.plugins import catalog


def platform(uri: str) -> Any:
    settings = LibvirtSettings.model_validate(
        {"type": "libvirt", "uri": uri, "poll_interval": "0.05s"}
    )
    return catalog.load("platform", "libvirt")(PlatformName("kvm1"), settings, SystemClock())


def vm(name: str) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": f"res-{name}", "kind": "vm", "platform": "kvm1", "vm": name}
    )


def test_graceful_shutdown_then_power_on(libvirt_domains: LibvirtDomains) -> None:
    name = libvirt_domains.define("db", running=True, agent=True)

    async def scenario() -> list[Any]:
        kvm = platform(libvirt_domains.uri)
        [target] = await kvm.resolve(vm(name))
        seen: list[Any] = [await kvm.power_state(target)]
        await kvm.stop(target, StopMethod.GRACEFUL)
        seen.append(await kvm.wait_for(target, PowerState.OFF, 5))
        seen.append(libvirt_domains.state(name))
        await kvm.start(target)
        seen.append(await kvm.wait_for(target, PowerState.ON, 5))
        seen.append(await kvm.healthy(target))
        await kvm.close()
        return seen

    assert asyncio.run(scenario()) == [PowerState.ON, True, "shut off", True, True]
    assert libvirt_domains.state(name) == "running"


def test_hard_stop_destroys_the_domain(libvirt_domains: LibvirtDomains) -> None:
    name = libvirt_domains.define("hung", running=True)

    async def scenario() -> bool:
        kvm = platform(libvirt_domains.uri)
        [target] = await kvm.resolve(vm(name))
        await kvm.stop(target, StopMethod.HARD)
        done: bool = await kvm.wait_for(target, PowerState.OFF, 5)
        return done

    assert asyncio.run(scenario()) is True
    assert libvirt_domains.state(name) == "shut off"


def test_a_group_selects_domains_by_name_pattern(libvirt_domains: LibvirtDomains) -> None:
    web = sorted(libvirt_domains.define("web", running=True) for _ in range(3))
    libvirt_domains.define("db", running=True)
    group = ResourceConfig.model_validate(
        {"id": "web", "kind": "vm_group", "platform": "kvm1", "select": {"name": "web-*"}}
    )
    targets = asyncio.run(platform(libvirt_domains.uri).resolve(group))
    assert [t.name for t in targets] == web
    assert {t.kind for t in targets} == {ResourceKind.VM}


def test_a_missing_domain_is_named(libvirt_domains: LibvirtDomains) -> None:
    with pytest.raises(PermanentError, match=r"resource 'res-ghost'.*no domain named 'ghost'"):
        asyncio.run(platform(libvirt_domains.uri).resolve(vm("ghost")))


def test_a_host_that_does_not_answer_is_unreachable() -> None:
    uri = f"qemu+tcp://127.0.0.1:{free_port()}/system"
    with pytest.raises(PlatformUnreachable, match=r"libvirt 'kvm1' \(qemu\+tcp://127"):
        asyncio.run(platform(uri).open())
