"""Shutdown and startup plans from the site file (and, optionally, live inventory).

The shutdown plan stops a resource before anything it depends on; the
startup plan is its mirror. Steps start as soon as what they wait for is
done: there are no layer-by-layer barriers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from upsguard.config.checks import (
    Placements,
    cycle_problems,
    of_unknown_placement,
    on_its_runs_on,
)
from upsguard.config.resources import DEFAULT_START_S, DEFAULT_STOP_S, ResourceConfig
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.errors import ConfigError
from upsguard.models import (
    CacheName,
    Direction,
    PlatformName,
    ResourceId,
    ResourceKind,
    StepId,
    Target,
)
from upsguard.runbooks.graph import Node, NodeId, ResourceGraph, build_graph
from upsguard.runbooks.plan import (
    Action,
    Durations,
    EstimateSource,
    LearnedDuration,
    Plan,
    Quorum,
    Step,
    StepSettings,
)
from upsguard.runbooks.schedule import critical_path, list_schedule
from upsguard.runbooks.topology import contract, topological_order
from upsguard.secrecy import program_name

Inventory = Mapping[ResourceId, list[Target]]


class Planner:
    """Plans of one site (and, optionally, one reading of live inventory).

    The graph, the managers' descendants and the cache gates are the same for every plan
    of the site, so they are worked out once, here, and shared by the shutdown, the
    startup and every partial plan (shedding, ``trigger --only``).

    Each step's estimate comes from, in order: what past runs took (``durations``, learned
    from the journal; their p90), the resource's ``estimate:``, the simulated platform's
    typical duration, upsguard's default for the kind. The step says which
    (``Step.estimate_source``).
    """

    def __init__(
        self,
        site: SiteConfig,
        inventory: Inventory | None = None,
        unplanned: Mapping[str, Sequence[str]] | None = None,
        *,
        durations: Durations | None = None,
    ) -> None:
        """``unplanned``: per host name, the running VMs live inventory found that no
        resource covers; the host step stops them first, and its text says so.
        ``durations``: learned figures per resource and direction (``controller.learned``)."""
        self.site = site
        self.inventory = inventory
        self.durations: Durations = durations or {}
        self._unplanned = unplanned or {}
        self._graph = build_graph(site, inventory)
        _refuse_cycles(site, self._graph)
        self._managers = _manager_descendants(site, self._graph)
        self._starting_apart = _started_apart(self._graph, self._managers)
        self._gated = _cache_gates(site, self._graph)
        self._plans: dict[tuple[Direction, frozenset[ResourceId] | None], Plan] = {}

    def plan(self, direction: Direction | str, only: set[ResourceId] | None = None) -> Plan:
        """The ordered plan; ``only`` limits it to some resources, and what needs them (a
        shutdown stops that first) or what they need (a startup starts that first).
        Plans are immutable: each is made once and handed out again."""
        key = (Direction(direction), frozenset(only) if only is not None else None)
        if key not in self._plans:
            self._plans[key] = self._make(*key)
        return self._plans[key]

    def _make(self, direction: Direction, only: frozenset[ResourceId] | None) -> Plan:
        site, graph = self.site, self._graph
        chosen = set(only) if only is not None else None
        keep, left_to_ups = _select_nodes(site, graph, direction, site.resource_index(), chosen)
        if only is not None and keep == self._selected(direction):
            # What ``only`` needs is the whole site (a feed that powers every host): the
            # site's plan, made once, not a copy of it per feed.
            return self.plan(direction)
        order_edges = contract(graph, keep, direction)
        if direction is Direction.STARTUP:
            order_edges = _reversed(order_edges)
        order = topological_order(order_edges, [n for n in graph.nodes if n in keep])
        maker = _StepMaker(
            site,
            direction,
            self._managers if direction is Direction.SHUTDOWN else self._starting_apart,
            self._gated,
            order,
            self._unplanned,
            self.durations,
        )
        steps = [maker.step(graph.nodes[n], order_edges[n]) for n in order]
        if direction is Direction.SHUTDOWN:
            steps = _quorum_ends(site, steps)
        limits = {name: site.platform(name).max_parallel for name in _platforms(steps)}
        path, path_s = critical_path(steps, limits)
        return Plan(
            direction=direction,
            steps=tuple(steps),
            critical_path=path,
            critical_path_s=path_s,
            estimate_s=list_schedule(steps, limits),
            limits=limits,
            stop_on_failure=direction is Direction.STARTUP or site.policies.step_failure == "stop",
            left_to_ups=tuple(left_to_ups),
            notes=tuple(_notes(site, left_to_ups, direction)),
        )

    def _selected(self, direction: Direction) -> set[NodeId]:
        """The nodes of the site's plan in ``direction``."""
        site = self.site
        return _select_nodes(site, self._graph, direction, site.resource_index(), None)[0]


def build_plans(site: SiteConfig, inventory: Inventory | None = None) -> tuple[Plan, Plan]:
    """The site's shutdown and startup plans."""
    planner = Planner(site, inventory)
    return planner.plan(Direction.SHUTDOWN), planner.plan(Direction.STARTUP)


def _refuse_cycles(site: SiteConfig, graph: ResourceGraph) -> None:
    """``ConfigError`` naming each cycle and where the VM in it runs. The site file's own
    cycles were refused when it was loaded; live inventory can make one more: a host that
    needs a VM found running on it."""
    needs: dict[ResourceId, list[ResourceId]] = {}
    placed: Placements = {}
    index = site.resource_index()
    for node in graph.nodes.values():
        if node.barrier:
            continue
        mine = needs.setdefault(node.resource, [])
        for then in graph.needs[node.id]:
            other = graph.nodes[then]
            hosts = [graph.nodes[h] for h in graph.needs[then]] if other.barrier else [other]
            for host in hosts:
                mine.append(host.resource)
                if other.barrier or host.resource not in index[node.resource].depends_on:
                    hop = (node.resource, host.resource)
                    placed.setdefault(hop, _placed_by(index[node.resource], node, host, site))
    problems = [site.problem(loc, message) for loc, message in cycle_problems(site, needs, placed)]
    if problems:
        raise ConfigError(problems)


def _placed_by(res: ResourceConfig, node: Node, host: Node, site: SiteConfig) -> str:
    """Why a VM stops before a host: where live inventory found it, else the site file."""
    name = site.resource(host.resource).target_name
    found = [t.name for t in node.targets if t.host == name]
    if found:
        shown = found[0] if found[0] == res.id else f"{found[0]} of {res.id}"
        return f"live inventory finds {shown} on {host.resource}"
    if host.resource in res.runs_on:
        return on_its_runs_on(res.id, host.resource)
    return of_unknown_placement(res.id, res.platform or "")


def _select_nodes(
    site: SiteConfig,
    graph: ResourceGraph,
    direction: Direction,
    resources: dict[ResourceId, ResourceConfig],
    only: set[ResourceId] | None,
) -> tuple[set[NodeId], list[ResourceId]]:
    def acts(node: Node) -> bool:
        if node.barrier:
            return True
        res = resources[node.resource]
        return res.stops if direction is Direction.SHUTDOWN else res.starts

    keep = {n.id for n in graph.nodes.values() if acts(n)}
    left: list[ResourceId] = []
    if direction is Direction.SHUTDOWN:
        for res in site.resources:
            if res.runs_upsguard:
                below = graph.descendants(res.id) - {res.id}
                left = sorted({graph.nodes[n].resource for n in below if n in keep})
                keep -= below
    if only is not None:
        chosen = [n.id for n in graph.nodes.values() if n.resource in only]
        if direction is Direction.SHUTDOWN:
            keep &= graph.needed_by(chosen)  # what needs them stops first
        else:
            keep &= graph.needs_of(chosen)  # what they need starts first
    return keep, left


def _reversed(edges: dict[NodeId, set[NodeId]]) -> dict[NodeId, set[NodeId]]:
    """``edges`` maps a node to what it waits for; reverse the waiting."""
    out: dict[NodeId, set[NodeId]] = {n: set() for n in edges}
    for node, waits in edges.items():
        for w in waits:
            out[w].add(node)
    return out


def _manager_descendants(site: SiteConfig, graph: ResourceGraph) -> dict[str, set[NodeId]]:
    """For each managed platform, the nodes that stop after its manager (they go direct)."""
    out: dict[str, set[NodeId]] = {}
    for res in site.resources:
        if res.serves_platform is not None and res.id in graph.nodes:
            out[res.serves_platform] = graph.descendants(res.id) - {res.id}
    return out


def _started_apart(
    graph: ResourceGraph, managers: dict[str, set[NodeId]]
) -> dict[str, set[NodeId]]:
    """For each managed platform, the nodes a startup reaches directly: those that stop after
    its manager, and the hosts that start without it (powered on by their BMC)."""
    out = {platform: set(nodes) for platform, nodes in managers.items()}
    for first, _ in graph.shutdown_only:
        platform = graph.nodes[first].platform
        if platform is not None:
            out.setdefault(platform, set()).add(first)
    return out


def _cache_gates(site: SiteConfig, graph: ResourceGraph) -> dict[NodeId, list[CacheName]]:
    """Hardware nodes in the data path of each cache: they wait until it is clean."""
    gated: dict[NodeId, list[CacheName]] = {}
    if not site.caches:
        return gated
    placed_on = _placement(site, graph)
    for cache in site.caches:
        path: set[ResourceId] = {cache.lives_on} if cache.lives_on is not None else set()
        for rid in cache.carries:
            path |= _data_path(site, placed_on, rid)
        for node in graph.nodes.values():
            if node.resource in path and node.kind.is_hardware:
                gated.setdefault(node.id, []).append(cache.name)
    return gated


def _placement(site: SiteConfig, graph: ResourceGraph) -> dict[ResourceId, list[ResourceId]]:
    """The hosts live inventory placed each resource's VMs on."""
    host_by_name = {r.target_name: r.id for r in site.resources if r.kind is ResourceKind.HOST}
    placed_on: dict[ResourceId, list[ResourceId]] = {}
    for node in graph.nodes.values():
        hosts = [host_by_name[t.host] for t in node.targets if t.host in host_by_name]
        if hosts:
            placed_on.setdefault(node.resource, []).extend(hosts)
    return placed_on


def _data_path(
    site: SiteConfig, placed_on: dict[ResourceId, list[ResourceId]], start: ResourceId
) -> set[ResourceId]:
    """The hardware a resource's writes go through: its hosts, and the storage they depend on.

    A VM is where live inventory found it, else where the site file says; when neither
    knows, on any host of its platform (each of them could hold its data). A host or
    storage named itself is in its own data path. Only hardware is followed past the
    first hop: a VM that needs another VM (for DNS, say) does not put that VM's host in
    its data path.
    """
    index = site.resource_index()
    found: set[ResourceId] = {start} if index[start].kind.is_hardware else set()
    stack = [start]
    while stack:
        res = index[stack.pop()]
        hosts = placed_on.get(res.id) or list(res.runs_on)
        if not hosts and res.kind in (ResourceKind.VM, ResourceKind.VM_GROUP) and res.platform:
            hosts = [h.id for h in site.hosts_of_platform(res.platform)]
        for rid in [*res.depends_on, *hosts]:
            if rid not in found and index[rid].kind.is_hardware:
                found.add(rid)
                stack.append(rid)
    return found


def _quorum_ends(site: SiteConfig, steps: list[Step]) -> list[Step]:
    """Mark, for each platform with cluster steps, the node step after which the cluster has
    no more than half its nodes up (its quorum gone: pmxcfs turns read-only), counting the
    node steps in plan order. Its nodes are the site file's hosts of the platform."""
    clusters = {r.platform for r in site.resources if r.kind is ResourceKind.CLUSTER}
    out = list(steps)
    for platform in sorted(p for p in clusters if p is not None):
        nodes = len(site.hosts_of_platform(platform))
        down_at = (nodes + 1) // 2
        hosts = [
            i for i, s in enumerate(out) if s.kind is ResourceKind.HOST and s.platform == platform
        ]
        if nodes and len(hosts) >= down_at:
            index = hosts[down_at - 1]
            mark = Quorum(PlatformName(platform), down_at, nodes)
            out[index] = replace(out[index], quorum_ends=mark)
    return out


def _platforms(steps: list[Step]) -> list[str]:
    return sorted({s.platform for s in steps if s.platform is not None})


class _StepMaker:
    """Turns graph nodes into steps; what depends only on a platform is worked out once."""

    def __init__(
        self,
        site: SiteConfig,
        direction: Direction,
        managers: dict[str, set[NodeId]],
        gated: dict[NodeId, list[CacheName]],
        nodes: Sequence[NodeId],
        unplanned: Mapping[str, Sequence[str]],
        durations: Durations,
    ) -> None:
        self._site = site
        self._durations = durations
        self._resources = site.resource_index()
        self._direction = direction
        self._prefix = "stop" if direction is Direction.SHUTDOWN else "start"
        self._managers = managers
        self._gated = gated if direction is Direction.SHUTDOWN else {}
        self.unplanned = unplanned
        self._settings: dict[ResourceId, StepSettings] = {}
        self._limits: dict[str, int] = {}
        self._timings: dict[tuple[str, ResourceKind], _Figure | None] = {}
        self._ids = {n: StepId(f"{self._prefix}:{n}") for n in nodes}

    def step(self, node: Node, waits: set[NodeId]) -> Step:
        ids = self._ids
        sid = ids[node.id]
        waits_for = tuple(sorted([ids[w] for w in waits]))
        if node.barrier:
            return Step(
                sid,
                node.resource,
                node.kind,
                None,
                Action.BARRIER,
                waits_for,
                0.0,
                self._barrier_text(node),
            )
        res = self._resources[node.resource]
        direct = node.platform is not None and node.id in self._managers.get(node.platform, ())
        action = _action(res, self._direction)
        count = (
            len(node.targets) if node.targets and node.kind is ResourceKind.VM_GROUP else node.count
        )
        rounds = math.ceil(count / self._limit(res.platform)) if count > 1 else 1
        figure, configured_s = self._figure(res, node, rounds)
        seconds = figure.step_seconds(rounds)
        return Step(
            id=sid,
            resource=node.resource,
            kind=node.kind,
            platform=res.platform,
            action=action,
            waits_for=waits_for,
            estimate_s=seconds,
            description=self._describe(res, node, action, count, direct),
            settings=self._settings_of(res),
            targets=node.targets,
            members=count,
            member=node.id != node.resource,
            caches=tuple(self._gated.get(node.id, ())),
            direct=direct,
            estimate_source=figure.source,
            learned=figure.learned,
            configured_s=configured_s,
        )

    def _barrier_text(self, node: Node) -> str:
        """A shutdown stops the VMs no one placed before any host of their platform; a
        startup starts every host of the platform before them."""
        if self._direction is Direction.SHUTDOWN:
            return f"wait until every VM of unknown placement on {node.gathers} is down"
        return (
            f"wait until every host of {node.gathers} is up: VMs of unknown placement may "
            "run on any of them"
        )

    def _figure(self, res: ResourceConfig, node: Node, rounds: int) -> tuple[_Figure, float | None]:
        """The step's duration, and the configured one when a learned figure is below it."""
        if res.runs_upsguard and self._direction is Direction.STARTUP:
            return _Figure(0.0, EstimateSource.OWN_MACHINE.value), None
        return self._trusted(self._learned(res, node), self._estimate(res), rounds)

    def _settings_of(self, res: ResourceConfig) -> StepSettings:
        """One per resource: a group's members share their resource's settings."""
        found = self._settings.get(res.id)
        if found is None:
            startup = self._direction is Direction.STARTUP
            found = self._settings[res.id] = StepSettings(
                resource=res,
                timeout_s=_timeout(res, self._direction),
                retries=res.retries,
                fallback=res.fallback,
                fallback_without_graceful=self._site.fallback_without_graceful(res),
                power_on_via=PlatformName(res.power_on_via)
                if startup and res.power_on_via
                else None,
            )
        return found

    def _describe(
        self, res: ResourceConfig, node: Node, action: Action, count: int, direct: bool
    ) -> str:
        text = _describe(res, node, action, count, direct)
        if self.unplanned and action is Action.HOST_SHUTDOWN:
            text = self._unplanned_note(res) + text
        if (
            res.kind is ResourceKind.HOST
            and res.platform
            and not (direct and action is Action.HOST_SHUTDOWN)
        ):
            note = self._site.platform(res.platform).host_step_note(action is Action.HOST_SHUTDOWN)
            text = note + text if action is Action.HOST_SHUTDOWN else text + note
        if node.targets and self._direction is Direction.SHUTDOWN:
            text += self._tools_note(res, node)
        return text

    def _unplanned_note(self, res: ResourceConfig) -> str:
        """A host step stops the VMs no resource covers (or leaves them, per the platform)."""
        vms = self.unplanned.get(res.target_name, ())
        if not vms:
            return ""
        settings = self._site.platform(res.platform) if res.platform else None
        names = f"{len(vms)} VM(s) no resource covers ({', '.join(sorted(vms))})"
        if settings is not None and settings.leaves_unplanned_vms:
            return f"leave running {names}, "
        return f"stop {names}, "

    def _tools_note(self, res: ResourceConfig, node: Node) -> str:
        """What happens to VMs live inventory found without a graceful path (no VMware Tools)."""
        without = [t.name for t in node.targets if t.graceful is False]
        if not without:
            return ""
        fate = {
            "skip": "left running (skip)",
            "power_off": "powered off at once",
            "fail": "the step fails",
        }[self._site.fallback_without_graceful(res)]
        if len(node.targets) == 1:
            return f"; no VMware Tools: {fate}"
        names = ", ".join(without[:3]) + (", ..." if len(without) > 3 else "")
        return f"; {len(without)} without VMware Tools ({names}): {fate}"

    def _limit(self, platform: str | None) -> int:
        if platform is None:
            return 1
        if platform not in self._limits:
            self._limits[platform] = self._site.platform(platform).max_parallel
        return self._limits[platform]

    def _trusted(
        self, learned: _Figure | None, configured: _Figure, rounds: int
    ) -> tuple[_Figure, float | None]:
        """The figure the step counts on: a learned one, unless it is below the configured
        estimate further than the site file allows (then held there); and the configured
        estimate when the learned one is below it."""
        if learned is None:
            return configured, None
        learned_s, configured_s = learned.step_seconds(rounds), configured.step_seconds(rounds)
        if learned_s >= configured_s:
            return learned, None
        floor_s = configured_s * self._site.policies.learning.may_lower_to_pct / 100
        if learned_s >= floor_s:
            return learned, configured_s
        held = f"{learned.source}: {format_duration(learned_s)}, held at {format_duration(floor_s)}"
        return _Figure(floor_s, held, whole_step=True, learned=learned.learned), configured_s

    def _learned(self, res: ResourceConfig, node: Node) -> _Figure | None:
        """What past runs took, when they took it in the shape of this step: a figure learned
        from single members fits a member or each round of a group; one learned from whole
        group steps fits only a whole group. A figure counts once enough runs taught it
        (``policies.learning.min_runs``)."""
        learned: LearnedDuration | None = self._durations.get((res.id, self._direction))
        if learned is None or learned.runs < self._site.policies.learning.min_runs:
            return None
        member = node.id != res.id  # one VM of a group expanded from inventory
        if member and not learned.per_member:
            return None
        whole = res.kind is ResourceKind.VM_GROUP and not member and not learned.per_member
        return _Figure(learned.p90_s, learned.source, whole_step=whole, learned=learned)

    def _estimate(self, res: ResourceConfig) -> _Figure:
        given = res.estimate.stop if self._direction is Direction.SHUTDOWN else res.estimate.start
        if given is not None:
            return _Figure(given.total_seconds(), EstimateSource.ESTIMATE.value)
        simulated = self._simulated_timing(res) if res.platform else None
        if simulated is not None:
            return simulated
        table = DEFAULT_STOP_S if self._direction is Direction.SHUTDOWN else DEFAULT_START_S
        extra = 60.0 if res.maintenance_mode and self._direction is Direction.SHUTDOWN else 0.0
        return _Figure(table[res.kind] + extra, EstimateSource.DEFAULT.value)

    def _simulated_timing(self, res: ResourceConfig) -> _Figure | None:
        """The simulated platform's typical duration, one figure per platform and kind."""
        key = (res.platform or "", res.kind)
        if key not in self._timings:
            typical = self._site.platform(key[0]).typical_duration(
                _simulated_field(res.kind, self._direction)
            )
            self._timings[key] = (
                _Figure(typical.total_seconds(), EstimateSource.PLATFORM.value)
                if typical is not None
                else None
            )
        return self._timings[key]


@dataclass(frozen=True, slots=True)
class _Figure:
    """One step's duration and where it came from."""

    seconds: float
    source: str
    whole_step: bool = False
    """Already covers every member of a group (learned from whole-group steps)."""
    learned: LearnedDuration | None = None

    def step_seconds(self, rounds: int) -> float:
        """The whole step: a member's figure counts once per round of members."""
        return self.seconds if self.whole_step else self.seconds * rounds


_SHUTDOWN_ACTION = {
    ResourceKind.VM: Action.GUEST_SHUTDOWN,
    ResourceKind.VM_GROUP: Action.GUEST_SHUTDOWN,
    ResourceKind.HOST: Action.HOST_SHUTDOWN,
    ResourceKind.COMMAND: Action.COMMAND,
}


def _action(res: ResourceConfig, direction: Direction) -> Action:
    if direction is Direction.STARTUP:
        return Action.HOST_POWER_ON if res.kind is ResourceKind.HOST else Action.POWER_ON
    return _SHUTDOWN_ACTION.get(res.kind, Action.DEVICE_SHUTDOWN)


def _simulated_field(kind: ResourceKind, direction: Direction) -> str:
    if direction is Direction.STARTUP:
        return "host_power_on" if kind is ResourceKind.HOST else "power_on"
    if kind in (ResourceKind.VM, ResourceKind.VM_GROUP):
        return "guest_shutdown"
    return "host_shutdown" if kind is ResourceKind.HOST else "device_shutdown"


STARTUP_TIMEOUT_S = 600.0
"""How long a start may take to be on and healthy when the resource has no ``health:``."""


def _timeout(res: ResourceConfig, direction: Direction) -> float:
    if direction is Direction.STARTUP:
        return res.health.timeout.total_seconds() if res.health else STARTUP_TIMEOUT_S
    return res.guest_timeout.total_seconds()


def _describe(res: ResourceConfig, node: Node, action: Action, count: int, direct: bool) -> str:
    if res.kind is ResourceKind.CLUSTER:
        return _cluster_text(res, action)
    via = ""
    if direct:
        down = "is down" if action is not Action.HOST_POWER_ON else "may not be up yet"
        via = f" (directly on the host: its manager {down})"
    what = _what(res, node, count)
    if action is Action.GUEST_SHUTDOWN:
        return f"guest shutdown of {what}, {_fallback_phrase(res.fallback, res.guest_timeout)}{via}"
    if action is Action.HOST_SHUTDOWN:
        mm = "enter maintenance mode, then " if res.maintenance_mode else ""
        return f"{mm}shut down host {res.target_name}{via}"
    if action in (Action.DEVICE_SHUTDOWN, Action.COMMAND):
        command = f" with '{program_name(res.shutdown)}'" if res.shutdown else ""
        return f"shut down {res.kind} {res.target_name}{command} via {res.platform}"
    if action is Action.HOST_POWER_ON:
        through = f" through {res.power_on_via}" if res.power_on_via else ""
        return f"power on host {res.target_name}{through}, wait until it is connected{via}"
    check = "health check" if res.health else "platform check"
    return f"start {what}, wait for its {check}{via}"


@functools.lru_cache(maxsize=256)
def _fallback_phrase(fallback: str, guest_timeout: timedelta) -> str:
    """Thousands of VMs share a few fallback settings: each phrase is built once."""
    grace = format_duration(guest_timeout)
    if fallback == "power_off":
        return f"power off after {grace} if still on"
    if fallback == "skip":
        return f"leave it after {grace} (fallback: skip)"
    return f"fail after {grace}"


def _cluster_text(res: ResourceConfig, action: Action) -> str:
    """What a cluster-state step does, each way."""
    stopping = action is not Action.POWER_ON
    if res.cluster == "ha":
        if stopping:
            return (
                f"disarm HA of {res.platform} (resources ignored), recording its state, "
                "before any of its guests stops"
            )
        return (
            f"re-arm HA of {res.platform} if upsguard disarmed it, once its guests are up "
            "(HA would start them all at once, ahead of their dependencies)"
        )
    if stopping:
        return (
            f"set the Ceph flags of {res.platform} (noout... per the platform), recording "
            "those already set, once its guests are down and before its nodes stop"
        )
    return f"unset the Ceph flags upsguard set on {res.platform}, once its nodes are up"


def _what(res: ResourceConfig, node: Node, count: int) -> str:
    if res.kind is ResourceKind.VM_GROUP and node.kind is ResourceKind.VM_GROUP:
        crit = f" ({res.select.describe()})" if res.select is not None else ""
        return f"{count} VMs of group {res.id}{crit}"
    if node.kind is ResourceKind.VM and node.targets:
        return f"VM {node.targets[0].name}"
    return f"{res.kind} {res.target_name}"


def _notes(site: SiteConfig, left: list[ResourceId], direction: Direction) -> list[str]:
    notes = []
    if left and direction is Direction.SHUTDOWN:
        runner = next(r.id for r in site.resources if r.runs_upsguard)
        notes.append(
            f"upsguard runs on {runner}, so {', '.join(left)} cannot be stopped after it: "
            "they lose power with the UPS (see ups[].at_shutdown_end)"
        )
    return notes
