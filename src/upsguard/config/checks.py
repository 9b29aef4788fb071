"""Checks that span sections of the site file: references, duplicates, cycles.

Each returns ``(location, message)`` pairs so that every problem is reported
at once, with the file and line it came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from upsguard.config.site import SiteConfig
from upsguard.config.source import suggest
from upsguard.config.types import format_duration
from upsguard.config.ups import SnmpSettings
from upsguard.models import ResourceId, ResourceKind

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

_NEEDS_PLATFORM = (ResourceKind.VM, ResourceKind.VM_GROUP, ResourceKind.HOST, ResourceKind.COMMAND)


def site_problems(site: SiteConfig) -> list[Problem]:
    problems: list[Problem] = []
    for check in (
        _duplicates,
        _references,
        _platform_refs,
        _feeds,
        _caches,
        _cycles,
        _ups_command_outlasts_own_machine,
        _snmp_can_send,
    ):
        problems.extend(check(site))
    return problems


def _duplicates(site: SiteConfig) -> Iterator[Problem]:
    for section, names in (
        ("ups", [u.name for u in site.ups]),
        ("resources", [r.id for r in site.resources]),
        ("caches", [c.name for c in site.caches]),
    ):
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                yield (section, index), f"duplicate name '{name}'"
            seen.add(name)


def _unknown(kind: str, name: str, known: Sequence[str]) -> str:
    return f"unknown {kind} '{name}'{suggest(name, known)}"


def _references(site: SiteConfig) -> Iterator[Problem]:
    ids = [r.id for r in site.resources]
    known = set(ids)
    index = site.resource_index()
    for i, res in enumerate(site.resources):
        for j, dep in enumerate(res.depends_on):
            if dep not in known:
                yield ("resources", i, "depends_on", j), _unknown("resource", dep, ids)
            elif dep == res.id:
                yield ("resources", i, "depends_on", j), f"'{res.id}' cannot depend on itself"
        for j, host in enumerate(res.runs_on):
            if host not in known:
                yield ("resources", i, "runs_on", j), _unknown("resource", host, ids)
            elif index[host].kind is not ResourceKind.HOST:
                yield (
                    ("resources", i, "runs_on", j),
                    (f"'{host}' is a {index[host].kind}, not a host"),
                )


def _platform_refs(site: SiteConfig) -> Iterator[Problem]:
    names = [*site.platforms, "ssh", "command", "wol", "none", "simulated"]
    for i, res in enumerate(site.resources):
        if res.platform is None:
            if res.kind in _NEEDS_PLATFORM:
                yield ("resources", i), f"a {res.kind} needs 'platform'"
        elif not site.knows_platform(res.platform):
            yield ("resources", i, "platform"), _unknown("platform", res.platform, names)
        if res.power_on_via is not None and res.power_on_via not in site.platforms:
            yield (
                ("resources", i, "power_on_via"),
                _unknown("platform", res.power_on_via, list(site.platforms)),
            )
        if res.serves_platform is not None and res.serves_platform not in site.platforms:
            yield (
                ("resources", i, "serves_platform"),
                _unknown("platform", res.serves_platform, list(site.platforms)),
            )
    controllers = [i for i, r in enumerate(site.resources) if r.runs_upsguard]
    for i in controllers[1:]:
        yield ("resources", i, "runs_upsguard"), "only one resource can run upsguard"


def _feeds(site: SiteConfig) -> Iterator[Problem]:
    ups_names = [u.name for u in site.ups]
    ids = [r.id for r in site.resources]
    known = set(ids)
    for i, feed in enumerate(site.feeds):
        for j, ups in enumerate(feed.ups):
            if ups not in ups_names:
                yield ("feeds", i, "ups", j), _unknown("UPS", ups, ups_names)
        for j, rid in enumerate(feed.powers):
            if rid not in known:
                yield ("feeds", i, "powers", j), _unknown("resource", rid, ids)
        if feed.min_supplies > len(feed.ups):
            yield (
                ("feeds", i, "min_supplies"),
                f"needs {feed.min_supplies} supplies but the feed has {len(feed.ups)} UPS",
            )


def _caches(site: SiteConfig) -> Iterator[Problem]:
    ids = [r.id for r in site.resources]
    known = set(ids)
    for i, cache in enumerate(site.caches):
        if cache.lives_on is not None and cache.lives_on not in known:
            yield ("caches", i, "lives_on"), _unknown("resource", cache.lives_on, ids)
        for j, rid in enumerate(cache.carries):
            if rid not in known:
                yield ("caches", i, "carries", j), _unknown("resource", rid, ids)


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
    """Report each dependency cycle once, spelled out: ``cycle: a -> b -> a``."""
    graph = {r.id: [d for d in r.depends_on if d != r.id] for r in site.resources}
    position = {r.id: i for i, r in enumerate(site.resources)}
    for cycle in find_cycles(graph):
        start = cycle[0]
        loop = " -> ".join([*cycle, start])
        yield ("resources", position[start], "depends_on"), f"cycle: {loop}"


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
