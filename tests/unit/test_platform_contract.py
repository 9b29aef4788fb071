"""Every hardware platform the registry names is built as PlatformFactory says and is a Platform."""

from __future__ import annotations

import pytest

from upsguard.clock import SystemClock
from upsguard.config.caches import BUILTIN_PROVIDERS
from upsguard.config.platforms import BUILTIN_TYPES, PlatformBase
from upsguard.config.site import SiteConfig
from upsguard.models import PlatformName
from upsguard.plugins import catalog
from upsguard.plugins.platforms.base import InFlightTasks, Platform

SETTINGS: dict[str, dict[str, object]] = {
    "ipmi": {"host": "10.0.0.21", "user": "admin", "password_env": "BMC_PW"},
    "redfish": {"host": "https://10.0.0.22", "user": "root", "password_env": "RF_PW"},
    "ssh": {},
    "wol": {},
    "libvirt": {"uri": "test:///default"},
    "proxmox": {"host": "pve1.lab", "user": "root@pam", "password_env": "PVE_PW"},
    "command": {},
    "none": {},
}


@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_built_through_the_registry_it_is_a_platform(kind: str) -> None:
    assert kind in BUILTIN_TYPES
    site = SiteConfig.model_validate(
        {
            "site": "t",
            "ups": [{"name": "u", "simulated": {}}],
            "platforms": {"p": {"type": kind, **SETTINGS[kind]}},
        }
    )
    settings = site.platform("p")
    assert isinstance(settings, PlatformBase)
    platform = catalog.load("platform", kind)(PlatformName("p"), settings, SystemClock())
    assert isinstance(platform, Platform)
    assert platform.name == "p"


def test_the_registry_and_the_site_file_know_the_same_backends() -> None:
    """Adding a backend: its settings model in the config union, its class in the registry;
    nothing else lists it (the import contracts use wildcards)."""
    assert set(catalog.BUILTIN["platform"]) == BUILTIN_TYPES
    assert set(catalog.BUILTIN["cache"]) == BUILTIN_PROVIDERS


def test_the_platforms_that_list_their_tasks_offer_them_to_a_resumed_run() -> None:
    """vSphere and Proxmox run each request as a task they list; a resumed step waits for
    one still under way instead of asking again. The simulated platform lists its requests
    not landed yet, like them; the command platform lists its commands still running (their
    processes, found again after a restart). Other platforms have nothing to list."""
    offering = {
        kind for kind in BUILTIN_TYPES if issubclass(catalog.load("platform", kind), InFlightTasks)
    }
    assert offering == {"command", "proxmox", "simulated", "vsphere"}
