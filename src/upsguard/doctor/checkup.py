"""One checkup of a site: every check, several at once, each within its own time.

A check is a unit of work that yields findings: one UPS, one platform (its login, its own
``diagnose``, then each resource on it resolved and its state read), one cache (its targets,
mode and dirty bytes read, then its own ``diagnose``), a pair's etcd (each endpoint asked
on its own, over TLS as the pair speaks it, then the pair's keys read), the files, the
journal, the notifications (only when asked: they send a message), and the live plan. A
unit that runs past ``timeout`` or raises becomes one ``fail`` naming it; one broken unit
never hides the others. Nothing here stops, starts, flips or sends a command.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from upsguard.clock import Clock
from upsguard.config.policies import StartupPolicy
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_bytes, format_duration
from upsguard.doctor import places, site_files, web_page
from upsguard.errors import UpsguardError
from upsguard.findings import Area, Finding, Verdict, counts, fail, ok, warn, worst
from upsguard.models import (
    CacheName,
    LinkState,
    PlatformName,
    ResourceId,
    Target,
    UpsName,
    UpsReading,
)
from upsguard.plugins import catalog, registry
from upsguard.plugins.caches.base import CacheDiagnosis, CacheProvider
from upsguard.plugins.coordination.base import EndpointHealth
from upsguard.plugins.platforms.base import Platform, PlatformDiagnosis
from upsguard.plugins.ups.base import UpsDiagnosis, UpsSource

DEFAULT_TIMEOUT_S = 30.0
STORE = "etcd"
"""The subject of the store's findings that are not about one endpoint."""
AT_ONCE = 8
"""Checks running at the same time: enough to overlap slow logins, few enough for a BMC."""

NotifyCheck = Callable[[], Awaitable[list[Finding]]]


@dataclass(frozen=True)
class Checkup:
    """The findings of one run, in the order of the site file."""

    at: datetime
    findings: tuple[Finding, ...]
    took_s: float

    @property
    def verdict(self) -> Verdict:
        return worst(self.findings)

    @property
    def exit_code(self) -> int:
        """1 on any ``fail``, as a check that did not succeed; warnings do not fail it."""
        return 1 if self.verdict is Verdict.FAIL else 0

    def summary(self) -> str:
        n = counts(self.findings)
        return (
            f"{n[Verdict.OK]} ok, {n[Verdict.WARN]} warn, {n[Verdict.FAIL]} fail "
            f"in {format_duration(self.took_s)}"
        )


@dataclass
class Selection:
    """What ``--only`` keeps: whole areas (``ups``, ``platform``...) and names of entries."""

    areas: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()

    def keeps(self, area: Area, *names: str) -> bool:
        if not self.areas and not self.names:
            return True
        return area.value in self.areas or any(n in self.names for n in names)


@dataclass
class _Plugins:
    sources: dict[UpsName, UpsSource] = field(default_factory=dict)
    platforms: dict[PlatformName, Platform] = field(default_factory=dict)
    caches: dict[CacheName, CacheProvider] = field(default_factory=dict)
    opened: set[PlatformName] = field(default_factory=set)
    resolved: dict[ResourceId, list[Target]] = field(default_factory=dict)


async def run_checkup(
    site: SiteConfig,
    clock: Clock,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    only: Selection | None = None,
    notify: NotifyCheck | None = None,
    channels: NotifyCheck | None = None,
) -> Checkup:
    """Every check of ``site`` (``only`` some); ``notify``: also send a test notification;
    ``channels``: check the notification channels without sending (each Apprise URL read and
    understood)."""
    only = only or Selection()
    started, began = clock.now(), time.monotonic()
    plugins = _Plugins()
    findings = _build(site, plugins, only, clock)
    gate = asyncio.Semaphore(AT_ONCE)
    check = BoundedCheck(gate, timeout_s)
    commands = {u.name: u.commands for u in site.ups}
    startup = site.policies.startup
    units: list[Awaitable[list[Finding]]] = [
        check(Area.UPS, name, _ups(name, source, commands[name], startup))
        for name, source in plugins.sources.items()
    ]
    units += [
        check(Area.CACHE, name, _cache(name, provider)) for name, provider in plugins.caches.items()
    ]
    if site.ha is not None and only.keeps(Area.STORE, STORE):
        units.append(check(Area.STORE, STORE, _store(site)))
    if only.keeps(Area.FILE):
        units.append(check(Area.FILE, "files", _now(site_files.check_files, site)))
        units.append(check(Area.FILE, str(site.journal), _now(site_files.journal, site)))
    if only.keeps(Area.WEB):
        findings += web_page.check_web(site)
    if channels is not None and only.keeps(Area.NOTIFY):
        units.append(check(Area.NOTIFY, "notify", channels()))
    if notify is not None and only.keeps(Area.NOTIFY):
        units.append(check(Area.NOTIFY, "notify", notify()))
    try:
        platforms = asyncio.gather(
            *(
                _platform(site, name, p, plugins, check, only)
                for name, p in plugins.platforms.items()
            )
        )
        others = asyncio.gather(*units)
        for group in [*await platforms, *await others]:
            findings += group
        if only.keeps(Area.PLAN):
            opened = {n: p for n, p in plugins.platforms.items() if n in plugins.opened}
            findings += await check(Area.PLAN, "shutdown", places.check_plan(site, opened))
    finally:
        await _close(plugins)
    return Checkup(started, tuple(_ordered(site, findings)), time.monotonic() - began)


class BoundedCheck:
    """One unit of checks, within the gate (several at once) and its time."""

    def __init__(self, gate: asyncio.Semaphore, timeout_s: float) -> None:
        self.gate = gate
        self.timeout_s = timeout_s

    async def __call__(
        self, area: Area, subject: str, unit: Awaitable[list[Finding]]
    ) -> list[Finding]:
        began = time.monotonic()
        async with self.gate:
            try:
                async with asyncio.timeout(self.timeout_s):
                    found = await unit
            except TimeoutError:
                found = [
                    fail(
                        area,
                        subject,
                        "answer",
                        f"no answer within {format_duration(self.timeout_s)}",
                        "check that it is up and reachable from this machine",
                    )
                ]
            except UpsguardError as exc:
                found = [fail(area, subject, "answer", str(exc), _fix(exc))]
            except Exception as exc:  # a plugin's bug: that check fails, the others go on
                found = [fail(area, subject, "answer", f"internal error: {exc!r}", _BUG)]
        took = time.monotonic() - began
        return [f if f.took_s is not None else f.timed(took) for f in found]


_BUG = "report this as an upsguard bug, with the output of doctor -v"


def _fix(exc: UpsguardError) -> str:
    from upsguard.errors import (
        AuthenticationError,
        ConfigError,
        KeyFileUnreadable,
        TemporaryError,
    )

    if isinstance(exc, KeyFileUnreadable):
        return (
            "make the key (ssh-keygen -t ed25519 -N '' -f FILE) and add its .pub to the user's "
            "authorized_keys there, or set key_file to one this user can read"
        )
    if isinstance(exc, AuthenticationError):
        return "check the user and its password (or key) file, and its rights there"
    if isinstance(exc, ConfigError):
        return "fix the site file, or the file or variable it names"
    if isinstance(exc, TemporaryError):
        return "check that it is up, its address and port, and the network from here"
    return "see the message; fix the site file or the system it names"


async def _now(check: Callable[[SiteConfig], list[Finding]], site: SiteConfig) -> list[Finding]:
    """A quick local check (files), run in a thread: a hung NFS mount must not stop the loop."""
    return await asyncio.to_thread(check, site)


def _build(site: SiteConfig, plugins: _Plugins, only: Selection, clock: Clock) -> list[Finding]:
    """Each selected plugin built on its own: one that cannot be built is its own failure."""
    found: list[Finding] = []
    for ups in site.ups:
        if only.keeps(Area.UPS, ups.name):
            source = _make(found, Area.UPS, ups.name, "ups", ups.source_type, ups, clock)
            if source is not None:
                plugins.sources[ups.name] = source
    for name in registry.used_platform_names(site):
        settings = site.platform(name)
        kind = getattr(settings, "type", name)
        users = [r.id for r in site.resources if name in (r.platform, r.power_on_via)]
        if kind == "none" or not only.keeps(Area.PLATFORM, name, *users):
            continue
        key = PlatformName(name)
        platform = _make(found, Area.PLATFORM, name, "platform", kind, key, settings, clock)
        if platform is not None:
            plugins.platforms[key] = platform
    for cache in site.caches:
        if only.keeps(Area.CACHE, cache.name):
            provider = _make(found, Area.CACHE, cache.name, "cache", cache.provider, cache, clock)
            if provider is not None:
                plugins.caches[cache.name] = provider
    return found


def _make(
    found: list[Finding], area: Area, name: str, family: catalog.Family, kind: str, *args: Any
) -> Any:
    """The plugin ``kind`` of ``family`` built with ``args``; None (and a fail) when it
    cannot be (not installed, its settings refused)."""
    try:
        return catalog.load(family, kind)(*args)
    except UpsguardError as exc:
        found.append(fail(area, name, "plugin", str(exc), _fix(exc)))
        return None


async def _ups(
    name: UpsName, source: UpsSource, commands: list[str], startup: StartupPolicy
) -> list[Finding]:
    """The source's own checks (a source without them is read once), and whether the
    automatic startup can judge its charge."""
    if isinstance(source, UpsDiagnosis):
        found = await source.diagnose(commands)
        try:
            reading = await source.read()
        except UpsguardError:
            return found  # its own checks said why
    else:
        reading = await source.read()
        found = [ok(Area.UPS, name, "data", f"read: link {reading.link.value}")]
    return found + _startup_charge(name, reading, startup)


def _startup_charge(name: UpsName, reading: UpsReading, startup: StartupPolicy) -> list[Finding]:
    """The automatic startup waits for a charge it can read on every UPS: one that reports
    none keeps the site down after an outage until a person starts it."""
    judged = startup.automatic and "startup_runbook" in startup.then and startup.charge_above > 0
    if not judged or reading.link is not LinkState.OK or reading.charge_pct is not None:
        return []
    return [
        warn(
            Area.UPS,
            name,
            "charge",
            "reports no battery charge: after an outage the automatic startup waits for one "
            f"above {startup.charge_above:.0f} %",
            "set policies.startup.charge_above: 0 to start without judging the charge, or "
            "start the site by hand (upsguard trigger startup)",
        )
    ]


async def _platform(
    site: SiteConfig,
    name: PlatformName,
    platform: Platform,
    plugins: _Plugins,
    check: BoundedCheck,
    only: Selection,
) -> list[Finding]:
    """Log in; the platform's own checks; then each resource on it resolved and read (the
    resources ``--only`` names, unless it names the platform)."""
    found = await check(Area.PLATFORM, name, _login(name, platform))
    if any(f.verdict is Verdict.FAIL for f in found):
        return found
    plugins.opened.add(name)
    using = [r for r in site.resources if name in (r.platform, r.power_on_via)]
    if not only.keeps(Area.PLATFORM, name):
        using = [r for r in using if r.id in only.names]
    if isinstance(platform, PlatformDiagnosis):
        found += await check(Area.PLATFORM, name, platform.diagnose(using))
    else:
        found += [ok(Area.PLATFORM, name, "login", "connected")]
    stopped = [r for r in using if r.platform == name]
    for group in await asyncio.gather(
        *(check(Area.RESOURCE, r.id, places.check_resource(site, platform, r)) for r in stopped)
    ):
        found += group
    return found


async def _login(name: PlatformName, platform: Platform) -> list[Finding]:
    try:
        await platform.open()
    except UpsguardError as exc:
        return [fail(Area.PLATFORM, name, "login", str(exc), _fix(exc))]
    return []


async def _cache(name: CacheName, provider: CacheProvider) -> list[Finding]:
    """Targets found, each one's mode and dirty data read; then the provider's own checks."""
    try:
        targets = await provider.targets()
    except UpsguardError as exc:
        return [fail(Area.CACHE, name, "read", str(exc), _fix(exc))]
    states = await asyncio.gather(*(provider.read(t) for t in targets), return_exceptions=True)
    said: list[str] = []
    for target, state in zip(targets, states, strict=True):
        if isinstance(state, UpsguardError):
            return [fail(Area.CACHE, name, "read", f"{target.name}: {state}", _fix(state))]
        if isinstance(state, BaseException):
            raise state
        dirty = (
            "dirty unknown"
            if state.dirty_bytes is None
            else f"{format_bytes(state.dirty_bytes)} dirty"
        )
        said.append(f"{target.name} {state.mode.value}, {dirty}")
    found = [ok(Area.CACHE, name, "read", "; ".join(said) or "no targets")]
    if isinstance(provider, CacheDiagnosis):
        found += await provider.diagnose(targets)
    return found


async def _store(site: SiteConfig) -> list[Finding]:
    """Each etcd endpoint asked on its own, then the leader key read: the user, its password
    and its rights on the pair's prefix, with TLS as the pair uses it. Nothing is written."""
    store = registry.build_store(site)
    assert store is not None, "only a site with ha: has a store"
    try:
        found = [_endpoint(health) for health in await store.probe()]
        try:
            leader = await store.leader()
        except UpsguardError as exc:
            return [*found, fail(Area.STORE, STORE, "access", str(exc), _fix(exc))]
    finally:
        await store.close()
    who = "nobody leads" if leader is None else f"{leader.holder.name} leads (term {leader.token})"
    return [*found, ok(Area.STORE, STORE, "access", f"reads /upsguard/{site.site}/: {who}")]


def _endpoint(health: EndpointHealth) -> Finding:
    if not health.answered:
        return fail(
            Area.STORE,
            health.endpoint,
            "answer",
            health.detail,
            "check that the member runs, its address and port, and for https:// ha.tls "
            "(docs/ha.md)",
        )
    leads = " (leads etcd's own raft)" if health.is_leader else ""
    return ok(Area.STORE, health.endpoint, "answer", f"answered: etcd {health.version}{leads}")


async def _close(plugins: _Plugins) -> None:
    closing = [s.close() for s in plugins.sources.values()]
    closing += [p.close() for p in plugins.platforms.values()]
    closing += [c.close() for c in plugins.caches.values()]
    await asyncio.gather(*closing, return_exceptions=True)


_AREAS = list(Area)


def _ordered(site: SiteConfig, findings: Sequence[Finding]) -> list[Finding]:
    """In the order of the site file: UPSes, platforms, resources, caches, then the rest."""
    index: Mapping[Area, Collection[str]] = {
        Area.UPS: [u.name for u in site.ups],
        Area.PLATFORM: registry.used_platform_names(site),
        Area.RESOURCE: [r.id for r in site.resources],
        Area.CACHE: [c.name for c in site.caches],
    }

    def key(finding: Finding) -> tuple[int, int]:
        names = list(index.get(finding.area, ()))
        at = names.index(finding.subject) if finding.subject in names else len(names)
        return (_AREAS.index(finding.area), at)

    return sorted(findings, key=key)
