"""The site file's plugin names, and the class each stands for, without importing any plugin.

Built-in plugins are named here as ``module:Class`` strings and imported
only when a site uses them, so a heavy SDK (pyvmomi, pysnmp) loads only for
the sites that need it. Third parties add theirs through the
``upsguard.plugins`` entry-point group, naming them ``ups.NAME``,
``platform.NAME``, ``cache.NAME`` or ``coordination.NAME``. Apart from
``plugins.registry``, which builds the plugins a site uses: checking a site
file (``validate``) needs the names only, not the plugins' Protocols and what
they import (asyncio among them).
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from upsguard.errors import PluginNotFound

Family = Literal["ups", "platform", "cache", "coordination"]

BUILTIN: dict[str, dict[str, str]] = {
    "ups": {
        "nut": "upsguard.plugins.ups.nut:NutSource",
        "snmp": "upsguard.plugins.ups.snmp:SnmpSource",
        "simulated": "upsguard.plugins.ups.simulated:SimulatedUps",
    },
    "platform": {
        "vsphere": "upsguard.plugins.platforms.vsphere:VspherePlatform",
        "ipmi": "upsguard.plugins.platforms.ipmi:IpmiPlatform",
        "redfish": "upsguard.plugins.platforms.redfish:RedfishPlatform",
        "ssh": "upsguard.plugins.platforms.ssh:SshPlatform",
        "wol": "upsguard.plugins.platforms.wol:WolPlatform",
        "libvirt": "upsguard.plugins.platforms.libvirt:LibvirtPlatform",
        "proxmox": "upsguard.plugins.platforms.proxmox:ProxmoxPlatform",
        "command": "upsguard.plugins.platforms.command:CommandPlatform",
        "simulated": "upsguard.plugins.platforms.simulated:SimulatedPlatform",
        "none": "upsguard.plugins.platforms.none:NoPlatform",
    },
    "cache": {
        "bcache": "upsguard.plugins.caches.bcache:BcacheProvider",
        "lvmcache": "upsguard.plugins.caches.lvmcache:LvmcacheProvider",
        "writecache": "upsguard.plugins.caches.writecache:WritecacheProvider",
        "opencas": "upsguard.plugins.caches.opencas:OpencasProvider",
        "storcli": "upsguard.plugins.caches.storcli:StorcliProvider",
        "fvp": "upsguard.plugins.caches.fvp:FvpProvider",
        "command": "upsguard.plugins.caches.command:CommandCacheProvider",
        "simulated": "upsguard.plugins.caches.simulated:SimulatedCache",
    },
    "coordination": {
        "etcd": "upsguard.plugins.coordination.etcd:EtcdStore",
    },
}

STORE = "etcd"
"""The coordination store of a pair: the ``ha:`` section describes etcd, the only one yet."""


def load(family: Family, name: str) -> Any:
    """The class registered for ``name``; raises ``PluginNotFound`` naming what is missing."""
    spec = BUILTIN[family].get(name)
    if spec is not None:
        return _import(spec, family, name)
    for entry in _installed():
        if entry.name == f"{family}.{name}":
            return entry.load()
    known = ", ".join(sorted(BUILTIN[family]))
    raise PluginNotFound(f"no {family} plugin named '{name}' (built in: {known})")


@functools.cache
def _installed() -> tuple[EntryPoint, ...]:
    """The plugins installed through entry points, read once per process: reading them
    scans every installed distribution, and a site file read again (SIGHUP) asks anew."""
    return tuple(entry_points(group="upsguard.plugins"))


def names(family: str) -> list[str]:
    """Every plugin name of a family: built in, and installed through entry points."""
    prefix = f"{family}."
    installed = [e.name.removeprefix(prefix) for e in _installed() if e.name.startswith(prefix)]
    return sorted({*BUILTIN.get(family, {}), *installed})


def _import(spec: str, family: Family, name: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise PluginNotFound(f"the {family} plugin '{name}' is not in this build") from exc
        raise PluginNotFound(
            f"the {family} plugin '{name}' needs the Python package '{exc.name}': "
            f"install it (pip install {exc.name}) or remove '{name}' from the site file"
        ) from exc
    return getattr(module, attr)
