"""The site file as a whole, and the checks that span its sections."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Self

from pydantic import Field, PrivateAttr

from upsguard.config.base import Model
from upsguard.config.caches import CacheConfig
from upsguard.config.checks_schedule import ChecksConfig
from upsguard.config.ha import HaConfig
from upsguard.config.platforms import (
    IMPLICIT_TYPES,
    PlatformBase,
    PlatformConfig,
    implicit_platform,
)
from upsguard.config.policies import PoliciesConfig
from upsguard.config.resources import Fallback, ResourceConfig
from upsguard.config.service import ServiceConfig
from upsguard.config.source import Origin, format_path
from upsguard.config.types import LocalPath
from upsguard.config.ups import UpsConfig
from upsguard.config.web import WebConfig
from upsguard.models import ResourceId, ResourceKind, UpsName


class FeedConfig(Model):
    """Which UPSes power which resources; at risk when fewer than ``min_supplies`` are on line."""

    name: str | None = None
    ups: list[UpsName] = Field(min_length=1)
    min_supplies: int = Field(1, ge=1, le=1000)
    powers: list[ResourceId] = Field(default_factory=list)


def feed_name(feed: FeedConfig, index: int) -> str:
    """A feed's name: its own, or one made of its place and UPSes."""
    return feed.name or f"feed{index}:" + "+".join(feed.ups)


class Contact(Model):
    """Someone to call during an outage; printed in the run book."""

    name: str
    role: str | None = Field(None, description="what they look after, e.g. 'storage'")
    phone: str | None = None
    email: str | None = None
    notes: str | None = None


class SiteConfig(Model):
    site: str = Field(description="a short name for this site, used in logs and the journal")
    ups: list[UpsConfig] = Field(min_length=1)
    feeds: list[FeedConfig] = Field(default_factory=list)
    platforms: dict[str, PlatformConfig] = Field(default_factory=dict)
    caches: list[CacheConfig] = Field(default_factory=list)
    resources: list[ResourceConfig] = Field(default_factory=list)
    policies: PoliciesConfig = PoliciesConfig()
    journal: LocalPath = Field(
        Path("/var/lib/upsguard/journal.sqlite"), description="SQLite journal path"
    )
    service: ServiceConfig = ServiceConfig()
    web: WebConfig | None = Field(
        None, description="the live status page served by 'upsguard run' (docs/web.md); none: off"
    )
    checks: ChecksConfig | None = Field(
        None,
        description="run the checks of 'upsguard doctor' on a schedule (off when not given)",
    )
    contacts: list[Contact] = Field(
        default_factory=list, description="who to call during an outage (printed in the run book)"
    )
    ha: HaConfig | None = Field(
        None, description="two controllers, one acting, coordinated through etcd (docs/ha.md)"
    )
    _origin: Origin | None = PrivateAttr(None)

    def keep_origin(self, origin: Origin) -> None:
        """Remember where the entries were, for problems found after loading."""
        self._origin = origin

    def problem(self, loc: tuple[str | int, ...], message: str) -> str:
        """A problem found after loading (by the simulator's checks), with file:line when
        the site came from a file."""
        if self._origin is None:
            return f"{format_path(loc)}: {message}"
        return self._origin.problem(loc, message)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy whose indexes are rebuilt: cached lookups must follow ``update``."""
        copy = super().model_copy(update=update, deep=deep)
        for cached in ("_index", "_feeds_by_resource"):
            copy.__dict__.pop(cached, None)
        return copy

    def resource(self, rid: str) -> ResourceConfig:
        return self._index[ResourceId(rid)]

    def resource_index(self) -> dict[ResourceId, ResourceConfig]:
        return dict(self._index)

    @cached_property
    def _index(self) -> dict[ResourceId, ResourceConfig]:
        return {r.id: r for r in self.resources}

    def platform(self, name: str) -> PlatformBase:
        """The named platform, or default settings for a type a resource names directly."""
        if name in self.platforms:
            return self.platforms[name]
        return implicit_platform(name)

    def fallback_without_graceful(self, res: ResourceConfig) -> Fallback:
        """Without a graceful path (no VMware Tools) the platform may say to leave the VM
        running; otherwise the resource's own fallback applies."""
        settings = self.platform(res.platform) if res.platform else None
        return (settings.fallback_without_tools if settings else None) or res.fallback

    def never_powered_on(self, res: ResourceConfig) -> bool:
        """A host or storage that the startup runbook must start but nothing can power on:
        no ``power_on_via`` and a platform that cannot. Validate warns of it, and the
        simulator fails its start as the real run will."""
        if not res.starts or res.kind not in (ResourceKind.HOST, ResourceKind.STORAGE):
            return False
        if res.runs_upsguard:  # up whenever upsguard runs: its startup finds it up
            return False
        return res.power_on_via is None and not self.platform(res.platform or "none").can_power_on(
            res
        )

    def knows_platform(self, name: str) -> bool:
        return name in self.platforms or name in IMPLICIT_TYPES

    @cached_property
    def _feeds_by_resource(self) -> dict[ResourceId, list[FeedConfig]]:
        out: dict[ResourceId, list[FeedConfig]] = {}
        for feed in self.effective_feeds():
            for rid in feed.powers:
                out.setdefault(rid, []).append(feed)
        return out

    def effective_feeds(self) -> list[FeedConfig]:
        """The feeds, or without a feeds section each UPS alone powering everything (safe)."""
        if self.feeds:
            return list(self.feeds)
        everything = [r.id for r in self.resources]
        return [FeedConfig(name=u.name, ups=[u.name], powers=everything) for u in self.ups]

    def feeds_of(self, rid: ResourceId) -> list[FeedConfig]:
        return list(self._feeds_by_resource.get(rid, ()))

    def feeds_powering(self, rid: ResourceId) -> list[FeedConfig]:
        """The feeds a resource hangs on: its own, or those of the hosts it runs on (where
        the site file places it; a VM of unknown placement may be on any host of its
        platform). Empty when nothing says."""
        feeds = self.feeds_of(rid)
        if feeds:
            return feeds
        res = self.resource(rid)
        hosts = list(res.runs_on)
        if not hosts and res.kind in (ResourceKind.VM, ResourceKind.VM_GROUP) and res.platform:
            hosts = [h.id for h in self.hosts_of_platform(res.platform)]
        found = {id(f): f for host in hosts for f in self.feeds_of(host)}
        return list(found.values())

    def hosts_of_platform(self, platform: str) -> list[ResourceConfig]:
        return [r for r in self.resources if r.kind is ResourceKind.HOST and r.platform == platform]
