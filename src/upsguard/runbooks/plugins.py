"""Building plugin instances for a site through the registry.

The controller and the CLI never import a concrete plugin: they ask here,
and the registry imports the module that the site file names.
"""

from __future__ import annotations

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.models import CacheName, PlatformName, UpsName
from upsguard.plugins import registry
from upsguard.plugins.caches.base import CacheProvider
from upsguard.plugins.platforms.base import Platform
from upsguard.plugins.ups.base import UpsSource


def build_ups_sources(site: SiteConfig, clock: Clock) -> dict[UpsName, UpsSource]:
    sources: dict[UpsName, UpsSource] = {}
    for ups in site.ups:
        cls = registry.load("ups", ups.source_type)
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
        cls = registry.load("platform", getattr(settings, "type", name))
        platforms[PlatformName(name)] = cls(PlatformName(name), settings, clock)
    return platforms


def build_cache_providers(site: SiteConfig, clock: Clock) -> dict[CacheName, CacheProvider]:
    providers: dict[CacheName, CacheProvider] = {}
    for cache in site.caches:
        cls = registry.load("cache", cache.provider)
        providers[cache.name] = cls(cache, clock)
    return providers
