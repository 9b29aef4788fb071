"""The explicit map from the site file's names to plugin classes.

Built-in plugins are named here as ``module:Class`` strings and imported
only when a site uses them, so a heavy SDK (pyvmomi, pysnmp) loads only for
the sites that need it. Third parties add theirs through the
``upsguard.plugins`` entry-point group, naming them ``ups.NAME``,
``platform.NAME``, ``cache.NAME`` or ``coordination.NAME``.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from upsguard.clock import Clock
from upsguard.config.platforms import CommandSettings, ProxmoxSettings
from upsguard.config.site import SiteConfig
from upsguard.errors import PluginNotFound
from upsguard.models import CacheName, PlatformName, UpsName
from upsguard.plugins.caches.base import CacheProvider
from upsguard.plugins.coordination.base import CoordinationStore
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.ups.base import UpsSource

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


# -- building a site's plugins -----------------------------------------------------------


def build_ups_sources(site: SiteConfig, clock: Clock) -> dict[UpsName, UpsSource]:
    sources: dict[UpsName, UpsSource] = {}
    for ups in site.ups:
        cls = load("ups", ups.source_type)
        sources[ups.name] = cls(ups, clock)
    return sources


def used_platform_names(site: SiteConfig) -> list[str]:
    """Every platform a resource uses, named or implicit, plus BMCs used for power-on."""
    names: dict[str, None] = {}
    for res in site.resources:
        if res.platform is not None:
            names[res.platform] = None
        if res.power_on_via is not None:
            names[res.power_on_via] = None
    return list(names)


def build_platforms(site: SiteConfig, clock: Clock) -> dict[PlatformName, Platform]:
    platforms: dict[PlatformName, Platform] = {}
    for name in used_platform_names(site):
        settings = site.platform(name)
        if isinstance(settings, CommandSettings) and settings.state_dir is None:
            # its commands' exit statuses outlive the service: beside the journal, which does
            settings = settings.model_copy(update={"state_dir": site.journal.parent / "commands"})
        if isinstance(settings, ProxmoxSettings) and settings.state_dir is None:
            # what it changed on the cluster outlives the service, as the journal does
            settings = settings.model_copy(update={"state_dir": site.journal.parent / "proxmox"})
        cls = load("platform", getattr(settings, "type", name))
        platforms[PlatformName(name)] = cls(PlatformName(name), settings, clock)
    return platforms


def build_cache_providers(site: SiteConfig, clock: Clock) -> dict[CacheName, CacheProvider]:
    providers: dict[CacheName, CacheProvider] = {}
    for cache in site.caches:
        cls = load("cache", cache.provider)
        providers[cache.name] = cls(cache, clock)
    return providers


def build_store(site: SiteConfig) -> CoordinationStore | None:
    """The coordination store of a controller pair, when the site file has ``ha:``."""
    if site.ha is None:
        return None
    cls = load("coordination", STORE)
    store: CoordinationStore = cls(site.site, site.ha)
    return store


@dataclass(frozen=True, slots=True)
class SitePlugins:
    """Everything a controller acts through: its UPS sources, platforms and cache providers."""

    sources: dict[UpsName, UpsSource]
    platforms: dict[PlatformName, Platform]
    caches: dict[CacheName, CacheProvider]


def build_plugins(site: SiteConfig, clock: Clock) -> SitePlugins:
    """The site's plugins, each from the class its entry names."""
    return SitePlugins(
        build_ups_sources(site, clock),
        build_platforms(site, clock),
        build_cache_providers(site, clock),
    )
