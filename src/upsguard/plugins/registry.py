"""The plugins a site uses, built from its site file (``plugins.catalog`` maps the names to
the classes)."""

from __future__ import annotations

from dataclasses import dataclass

from upsguard.clock import Clock
from upsguard.config.platforms import CommandSettings, ProxmoxSettings
from upsguard.config.site import SiteConfig
from upsguard.models import CacheName, PlatformName, UpsName
from upsguard.plugins.caches.base import CacheProvider
from upsguard.plugins.catalog import STORE, load
from upsguard.plugins.coordination.base import CoordinationStore
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.ups.base import UpsSource

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
