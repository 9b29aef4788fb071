"""Checks that span sections of the site file: references, duplicates, cycles.

Each returns ``(location, message)`` pairs so that every problem is reported
at once, with the file and line it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from upsguard.config.ha_checks import ha_problems, ha_warnings
from upsguard.config.own_machine import weaker_feeds, without_a_way_back
from upsguard.config.platforms import SshSettings, WolSettings
from upsguard.config.site import SiteConfig
from upsguard.config.source import Suggestions, suggest
from upsguard.config.types import format_duration
from upsguard.config.ups import SnmpSettings
from upsguard.config.values import shorten
from upsguard.models import ResourceId, ResourceKind

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]


@dataclass(frozen=True)
class Unchecked:
    """Names of entries that failed validation, so that references to them are not called
    unknown; ``None`` for a section that could not be read at all (nothing into it is
    judged)."""

    ups: frozenset[str] | None = frozenset()
    resources: frozenset[str] | None = frozenset()
    platforms: frozenset[str] | None = frozenset()

    @staticmethod
    def has(names: frozenset[str] | None, name: str) -> bool:
        return names is None or name in names


_NOTHING = Unchecked()

_NEEDS_PLATFORM = (ResourceKind.VM, ResourceKind.VM_GROUP, ResourceKind.HOST, ResourceKind.COMMAND)


def site_problems(site: SiteConfig, unchecked: Unchecked = _NOTHING) -> list[Problem]:
    """Problems across sections; references to ``unchecked`` names are taken as valid."""
    problems: list[Problem] = []
    for check in (_duplicates, _references, _platform_refs, _feeds, _caches):
        problems.extend(check(site, unchecked))
    problems.extend(_cycles(site))
    problems.extend(_woken_without_a_mac(site))
    problems.extend(_ssh_settings_off_ssh(site))
    problems.extend(_ups_command_outlasts_own_machine(site))
    problems.extend(_snmp_can_send(site))
    problems.extend(ha_problems(site, unchecked.resources))
    return problems


PluginNames = Callable[[str], Collection[str]]
"""The plugin names of a family (``platform``, ``cache``), built in and installed."""


def plugin_problems(site: SiteConfig, names: PluginNames) -> Iterator[Problem]:
    """A platform ``type`` or cache ``provider`` no plugin provides: what ``run`` would
    refuse, so that ``validate`` (the unit's ExecStartPre) refuses it too."""
    platforms = names("platform")
    for key, settings in site.platforms.items():
        kind = getattr(settings, "type", None)
        if isinstance(kind, str) and kind not in platforms:
            hint = suggest(kind, platforms)
            yield (
                ("platforms", key, "type"),
                f"no platform plugin named {shorten(kind)!r}{hint}: built in or installed: "
                + ", ".join(platforms),
            )
    caches = names("cache")
    for i, cache in enumerate(site.caches):
        if cache.provider not in caches:
            hint = suggest(cache.provider, caches)
            yield (
                ("caches", i, "provider"),
                f"no cache plugin named {shorten(cache.provider)!r}{hint}: built in or "
                "installed: " + ", ".join(caches),
            )


def site_warnings(site: SiteConfig) -> list[Problem]:
    """What validate says without refusing the site: risks a person should know of."""
    return [
        *_never_powered_on(site),
        *_caches_of_unknown_placement(site),
        *_nut_in_clear(site),
        *_files_missing(site),
        *ha_warnings(site),
        *_weaker_feeds(site),
        *((("ups", i, "at_shutdown_end"), why) for i, why in without_a_way_back(site)),
    ]


def _weaker_feeds(site: SiteConfig) -> Iterator[Problem]:
    position = {r.id: i for i, r in enumerate(site.resources)}
    for weaker in weaker_feeds(site):
        yield ("resources", position[weaker.own]), weaker.said()


def _files_missing(site: SiteConfig) -> Iterator[Problem]:
    """A file the site names that cannot be read here. A warning, not a refusal: ``validate``
    is the service's ExecStartPre, and a missing password file must cost that one UPS or
    platform (an alert at every start), never the whole controller."""
    from upsguard.config.files import missing, named_files  # files builds on the site model

    for named in named_files(site):
        why = missing(named)
        if why is not None:
            yield named.loc, f"{why}: create it (readable by upsguard's user), or fix the path"


def _nut_in_clear(site: SiteConfig) -> Iterator[Problem]:
    for i, ups in enumerate(site.ups):
        nut = ups.nut
        if nut is None or not nut.in_clear_over_network:
            continue
        login = f"user '{nut.user}' and its password" if nut.user else "the readings"
        yield (
            ("ups", i, "nut"),
            f"UPS {ups.name}: upsd at {nut.host} is not on this machine and starttls is "
            f"off: {login} cross the network in clear. Set starttls: true (upsd needs "
            "CERTFILE), or allow_plaintext: true to accept it",
        )


def _never_powered_on(site: SiteConfig) -> Iterator[Problem]:
    for i, res in enumerate(site.resources):
        if site.never_powered_on(res):
            yield (
                ("resources", i),
                f"{res.id} can never be powered on by upsguard: no power_on_via (a BMC or "
                "wol) and no startup command; the startup runbook will fail on it. Add "
                "power_on_via, or start: false if it comes back with the power by itself",
            )


def _caches_of_unknown_placement(site: SiteConfig) -> Iterator[Problem]:
    vms = (ResourceKind.VM, ResourceKind.VM_GROUP)
    index = site.resource_index()
    for i, cache in enumerate(site.caches):
        for rid in cache.carries:
            res = index.get(rid)
            if res is None or res.kind not in vms or res.runs_on or res.platform is None:
                continue
            hosts = [h.id for h in site.hosts_of_platform(res.platform)]
            if len(hosts) > 1:
                yield (
                    ("caches", i),
                    f"cache {cache.name} carries {rid}, whose placement the site file does not "
                    f"give: the service plans from live inventory, but when that cannot be read "
                    f"every host of {res.platform} ({', '.join(hosts)}) waits for the cache "
                    f"(see 'upsguard plan shutdown --live')",
                )


def _woken_without_a_mac(site: SiteConfig) -> Iterator[Problem]:
    """A machine brought back by Wake-on-LAN (its ``power_on_via``, or its platform) needs its
    MAC address: without one the startup cannot power it on, so ``validate`` refuses it now
    rather than ``doctor`` (or the startup after an outage) finding it."""
    for i, res in enumerate(site.resources):
        if res.mac is not None:
            continue
        for field in ("power_on_via", "platform"):
            name = getattr(res, field)
            if name is not None and site.knows_platform(name) and _wakes(site, name):
                yield (
                    ("resources", i, field),
                    f"{shorten(name)!r} wakes {shorten(res.id)} with Wake-on-LAN, which needs "
                    "its MAC address: set mac like 'aa:bb:cc:dd:ee:ff'",
                )
                break


def _ssh_settings_off_ssh(site: SiteConfig) -> Iterator[Problem]:
    """A resource's ``ssh:`` block says how its commands run over SSH: on a resource whose
    platform is not an ssh one it would do nothing, and a site that counts on ``once`` would
    not have it, so ``validate`` refuses it."""
    for i, res in enumerate(site.resources):
        if res.ssh is None or res.platform is None or not site.knows_platform(res.platform):
            continue
        if not isinstance(site.platform(res.platform), SshSettings):
            yield (
                ("resources", i, "ssh"),
                f"'ssh' is for resources on an ssh platform; {shorten(res.platform)!r} is "
                f"not one: remove it, or put {shorten(res.id)} on an ssh platform",
            )


def _wakes(site: SiteConfig, name: str) -> bool:
    return isinstance(site.platform(name), WolSettings)


def _duplicates(site: SiteConfig, unchecked: Unchecked) -> Iterator[Problem]:
    for section, names in (
        ("ups", [u.name for u in site.ups]),
        ("resources", [r.id for r in site.resources]),
        ("caches", [c.name for c in site.caches]),
    ):
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                yield (section, index), f"duplicate name {shorten(name)!r}"
            seen.add(name)


def _unknown(kind: str, name: str, hint: Suggestions) -> str:
    return f"unknown {kind} {shorten(name)!r}{hint(name)}"


def _references(site: SiteConfig, unchecked: Unchecked) -> Iterator[Problem]:
    ids = [r.id for r in site.resources]
    known = set(ids)
    hint = Suggestions(ids)
    index = site.resource_index()
    for i, res in enumerate(site.resources):
        for j, dep in enumerate(res.depends_on):
            if dep not in known:
                if not Unchecked.has(unchecked.resources, dep):
                    yield ("resources", i, "depends_on", j), _unknown("resource", dep, hint)
            elif dep == res.id:
                yield (
                    ("resources", i, "depends_on", j),
                    f"{shorten(res.id)!r} cannot depend on itself",
                )
        for j, host in enumerate(res.runs_on):
            if host not in known:
                if not Unchecked.has(unchecked.resources, host):
                    yield ("resources", i, "runs_on", j), _unknown("resource", host, hint)
            elif index[host].kind is not ResourceKind.HOST:
                yield (
                    ("resources", i, "runs_on", j),
                    (f"'{host}' is a {index[host].kind}, not a host"),
                )


def _platform_refs(site: SiteConfig, unchecked: Unchecked) -> Iterator[Problem]:
    hint = Suggestions([*site.platforms, "ssh", "command", "wol", "none", "simulated"])
    named = Suggestions(site.platforms)

    def unknown(name: str, implicit: bool) -> bool:
        known = site.knows_platform(name) if implicit else name in site.platforms
        return not known and not Unchecked.has(unchecked.platforms, name)

    for i, res in enumerate(site.resources):
        if res.platform is None:
            if res.kind in _NEEDS_PLATFORM:
                yield ("resources", i), f"a {res.kind} needs 'platform'"
        elif unknown(res.platform, implicit=True):
            yield ("resources", i, "platform"), _unknown("platform", res.platform, hint)
        if res.power_on_via is not None and unknown(res.power_on_via, implicit=False):
            yield (
                ("resources", i, "power_on_via"),
                _unknown("platform", res.power_on_via, named),
            )
        if res.serves_platform is not None and unknown(res.serves_platform, implicit=False):
            yield (
                ("resources", i, "serves_platform"),
                _unknown("platform", res.serves_platform, named),
            )
    controllers = [i for i, r in enumerate(site.resources) if r.runs_upsguard]
    for i in controllers[1:]:
        yield ("resources", i, "runs_upsguard"), "only one resource can run upsguard"


def _feeds(site: SiteConfig, unchecked: Unchecked) -> Iterator[Problem]:
    ups_names = [u.name for u in site.ups]
    ids = [r.id for r in site.resources]
    known = set(ids)
    ups_hint, hint = Suggestions(ups_names), Suggestions(ids)
    for i, feed in enumerate(site.feeds):
        for j, ups in enumerate(feed.ups):
            if ups not in ups_names and not Unchecked.has(unchecked.ups, ups):
                yield ("feeds", i, "ups", j), _unknown("UPS", ups, ups_hint)
        for j, rid in enumerate(feed.powers):
            if rid not in known and not Unchecked.has(unchecked.resources, rid):
                yield ("feeds", i, "powers", j), _unknown("resource", rid, hint)
        if feed.min_supplies > len(feed.ups):
            yield (
                ("feeds", i, "min_supplies"),
                f"needs {feed.min_supplies} supplies but the feed has {len(feed.ups)} UPS",
            )


def _caches(site: SiteConfig, unchecked: Unchecked) -> Iterator[Problem]:
    ids = [r.id for r in site.resources]
    hint = Suggestions(ids)
    known = set(ids) | (unchecked.resources or set())
    everything = unchecked.resources is None
    for i, cache in enumerate(site.caches):
        if cache.lives_on is not None and cache.lives_on not in known and not everything:
            yield ("caches", i, "lives_on"), _unknown("resource", cache.lives_on, hint)
        for j, rid in enumerate(cache.carries):
            if rid not in known and not everything:
                yield ("caches", i, "carries", j), _unknown("resource", rid, hint)


OWN_MACHINE_MARGIN_S = 30.0
"""The UPS's delay must cover the stop of the machine running upsguard by this much."""


def _ups_command_outlasts_own_machine(site: SiteConfig) -> Iterator[Problem]:
    """The command at the end (``shutdown.return`` after ``delay``) is sent before the
    controller's own machine stops; a shorter delay cuts its power before it is down."""
    own = next((r for r in site.resources if r.runs_upsguard), None)
    if own is None:
        return
    need = own.stop_estimate_s + OWN_MACHINE_MARGIN_S
    for i, ups in enumerate(site.ups):
        end = ups.at_shutdown_end
        if end.command is not None and end.delay.total_seconds() < need:
            yield (
                ("ups", i, "at_shutdown_end", "delay"),
                f"{format_duration(end.delay)} is shorter than the stop of {own.id}, the machine "
                f"running upsguard ({format_duration(own.stop_estimate_s)}), plus a "
                f"{format_duration(OWN_MACHINE_MARGIN_S)} margin: the UPS would cut its power "
                f"before it is down; make the delay at least {format_duration(need)}, or give "
                f"{own.id} an estimate of its stop",
            )


def _snmp_can_send(site: SiteConfig) -> Iterator[Problem]:
    """An SNMP UPS can be told only what its MIB has SETs for: ``run`` would fail at the worst
    moment, at the end of a shutdown, so ``validate`` says it now."""
    for i, ups in enumerate(site.ups):
        command = ups.at_shutdown_end.command
        if ups.snmp is None or command is None:
            continue
        known = SnmpSettings.COMMANDS[ups.snmp.mib]
        if command not in known:
            yield (
                ("ups", i, "at_shutdown_end", "command"),
                f"'{command}' cannot be sent over SNMP with {ups.snmp.mib}: use one of "
                f"{', '.join(sorted(known))}, or a NUT source (snmp-ups driver) for others",
            )


def _cycles(site: SiteConfig) -> Iterator[Problem]:
    """Report each cycle once, spelled out: ``cycle: a -> b -> a``. A VM needs the host it
    runs on as much as what it depends on, so where the site file places each VM counts too
    (``runs_on``; a VM it does not place may be on any host of its platform)."""
    needs, placed = _needs(site)
    yield from cycle_problems(site, needs, placed)


Placements = dict[tuple[ResourceId, ResourceId], str]
"""Why a VM needs a host, per (VM, host): where it runs, in words (``dc01 runs on esx01,
its runs_on``)."""


def _needs(site: SiteConfig) -> tuple[dict[ResourceId, list[ResourceId]], Placements]:
    """What each resource needs running: its ``depends_on``, and for a VM its hosts."""
    index = site.resource_index()
    needs = {r.id: [d for d in r.depends_on if d != r.id] for r in site.resources}
    placed: Placements = {}
    for res in site.resources:
        if res.kind not in (ResourceKind.VM, ResourceKind.VM_GROUP):
            continue
        if res.runs_on:
            for host in res.runs_on:
                if host in index and index[host].kind is ResourceKind.HOST:
                    placed[res.id, host] = on_its_runs_on(res.id, host)
        elif res.platform is not None:
            for found in site.hosts_of_platform(res.platform):
                placed[res.id, found.id] = of_unknown_placement(res.id, res.platform)
    for vm, host in placed:
        if host not in needs[vm]:
            needs[vm].append(host)
    return needs, placed


def on_its_runs_on(vm: ResourceId, host: ResourceId) -> str:
    return f"{vm} runs on {host}, its runs_on"


def of_unknown_placement(vm: ResourceId, platform: str) -> str:
    return f"{vm} has no runs_on: it may run on any host of platform {platform}"


def cycle_problems(
    site: SiteConfig, needs: dict[ResourceId, list[ResourceId]], placed: Placements
) -> Iterator[Problem]:
    """One problem per cycle of ``needs``. A cycle through a VM's placement is told from the
    host, at the ``depends_on`` entry that leads back to a VM on it, and says where that VM
    runs; any other at the ``depends_on`` of its first resource."""
    position = {r.id: i for i, r in enumerate(site.resources)}
    index = site.resource_index()
    for cycle in find_cycles(needs):
        hops = _hops(cycle)
        where = [
            placed[hop] for hop in hops if hop in placed and hop[1] not in index[hop[0]].depends_on
        ]
        loc: Loc = ("resources", position[cycle[0]], "depends_on")
        if where:
            first = next(i for i, hop in enumerate(hops) if placed.get(hop) == where[0])
            cycle = [*cycle[first + 1 :], *cycle[: first + 1]]  # from the host on
            host, then = cycle[0], cycle[1 % len(cycle)]
            deps = index[host].depends_on
            loc = ("resources", position[host], "depends_on")
            if then in deps:
                loc = (*loc, deps.index(then))
        names = [shorten(n, 40) for n in [*cycle, cycle[0]]]
        if len(names) > 9:  # the start, the way back, and how many in between
            names = [*names[:4], f"... {len(names) - 8} more", *names[-4:]]
        message = f"cycle: {' -> '.join(names)}"
        if where:
            message += (
                f" ({'; '.join(where)}): a host cannot need a VM that runs on it; drop the "
                "dependency, or run the VM elsewhere"
            )
        yield loc, message


def _hops(cycle: list[ResourceId]) -> list[tuple[ResourceId, ResourceId]]:
    """Each step of a cycle, the last one back to its start."""
    return list(zip(cycle, [*cycle[1:], cycle[0]], strict=True))


def find_cycles(graph: dict[ResourceId, list[ResourceId]]) -> list[list[ResourceId]]:
    """One representative cycle per strongly connected component with a loop (iterative Tarjan)."""
    children_of = {n: [c for c in children if c in graph] for n, children in graph.items()}
    if _acyclic(children_of):
        return []  # the usual case, told in one pass
    index: dict[ResourceId, int] = {}
    low: dict[ResourceId, int] = {}
    on_stack: set[ResourceId] = set()
    stack: list[ResourceId] = []
    cycles: list[list[ResourceId]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[ResourceId, int]] = [(root, 0)]
        while work:
            node, child_i = work.pop()
            if child_i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = children_of[node]
            if child_i < len(children):
                work.append((node, child_i + 1))
                child = children[child_i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component: list[ResourceId] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(_cycle_through(graph, set(component), node))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return cycles


def _acyclic(children_of: dict[ResourceId, list[ResourceId]]) -> bool:
    """Kahn's peeling: every node comes off when nothing leads into it any more."""
    waiting = dict.fromkeys(children_of, 0)
    for children in children_of.values():
        for child in children:
            waiting[child] += 1
    free = [n for n, count in waiting.items() if count == 0]
    peeled = 0
    while free:
        peeled += 1
        for child in children_of[free.pop()]:
            waiting[child] -= 1
            if waiting[child] == 0:
                free.append(child)
    return peeled == len(children_of)


def _cycle_through(
    graph: dict[ResourceId, list[ResourceId]], members: set[ResourceId], start: ResourceId
) -> list[ResourceId]:
    """A simple cycle from ``start`` back to it, inside one component (BFS for the shortest)."""
    previous: dict[ResourceId, ResourceId] = {}
    frontier = [start]
    while frontier:
        nxt: list[ResourceId] = []
        for node in frontier:
            for child in graph[node]:
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return list(reversed(path))
                if child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    return [start]
