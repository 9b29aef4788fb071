"""The resource graph: which stop must come before which.

An edge ``a -> b`` means "stop a before b" (so: start b before a). Edges come
from ``depends_on``, from VM placement (a VM before its host), and from the
rules that put some resources last: a platform's manager (vCenter) after the
VMs it manages, the machine upsguard runs on after everything, switches
after everything else.

Only the first two are needs (``a`` cannot run without ``b``); the rules that put some
resources last order a plan without making anything need them. So when ``b`` must stop
(its feed is failing, or a person stops it alone) what must stop with it follows the
needs (``needed_by``), not the ordering rules: losing the feed of the machine upsguard
runs on does not stop the site.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from upsguard.config.site import SiteConfig
from upsguard.models import Direction, ResourceId, ResourceKind, Target

NodeId = str


@dataclass(slots=True)
class Node:
    """One unit of the runbooks: a resource, or one VM of a group expanded from inventory."""

    id: NodeId
    resource: ResourceId
    kind: ResourceKind
    platform: str | None
    targets: tuple[Target, ...] = ()
    count: int = 1
    barrier: bool = False
    gathers: str | None = None
    """A barrier's platform: it stands between that platform's VMs of unknown placement and
    its hosts (they may run on any of them)."""


@dataclass
class ResourceGraph:
    nodes: dict[NodeId, Node] = field(default_factory=dict)
    after: dict[NodeId, set[NodeId]] = field(default_factory=dict)  # a -> {b: stop b after a}
    needs: dict[NodeId, set[NodeId]] = field(default_factory=dict)  # a -> {b: a needs b up}
    shutdown_only: set[tuple[NodeId, NodeId]] = field(default_factory=set)
    """Edges that order the shutdown alone: vCenter shuts a host down before it stops itself,
    but a host its BMC powers on and upsguard reaches directly does not wait for vCenter to
    start."""
    _before: dict[Direction, dict[NodeId, set[NodeId]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def add(self, node: Node) -> None:
        self.nodes[node.id] = node
        self.after.setdefault(node.id, set())
        self.needs.setdefault(node.id, set())
        self._before.clear()

    def edge(
        self, first: NodeId, then: NodeId, need: bool = True, shutdown_only: bool = False
    ) -> None:
        """Stop ``first`` before ``then``; ``need``: because ``first`` needs ``then`` running
        (not only to order the plan); ``shutdown_only``: the startup need not mirror it."""
        if first != then:
            self.after[first].add(then)
            if need:
                self.needs[first].add(then)
            if shutdown_only:
                self.shutdown_only.add((first, then))
            self._before.clear()

    def needed_by(self, nodes: Iterable[NodeId]) -> set[NodeId]:
        """``nodes`` and every node that needs one of them running, transitively: what
        must stop when they stop."""
        users: dict[NodeId, list[NodeId]] = {n: [] for n in self.nodes}
        for user, needed in self.needs.items():
            for n in needed:
                users[n].append(user)
        found = set(nodes)
        stack = list(found)
        while stack:
            for user in users[stack.pop()]:
                if user not in found:
                    found.add(user)
                    stack.append(user)
        return found

    def needs_of(self, nodes: Iterable[NodeId]) -> set[NodeId]:
        """``nodes`` and every node they need running, transitively: what must be up before
        they start."""
        found = set(nodes)
        stack = list(found)
        while stack:
            for needed in self.needs[stack.pop()]:
                if needed not in found:
                    found.add(needed)
                    stack.append(needed)
        return found

    def before(self, direction: Direction = Direction.SHUTDOWN) -> dict[NodeId, set[NodeId]]:
        """The reverse map: for each node, the nodes that must stop before it (in a startup:
        start after it, without the edges of the shutdown alone). Kept until the graph
        changes, as every plan of a site asks for it; callers only read it."""
        found = self._before.get(direction)
        if found is None:
            skip = self.shutdown_only if direction is Direction.STARTUP else set()
            found = {n: set() for n in self.nodes}
            for first, thens in self.after.items():
                for then in thens:
                    if (first, then) not in skip:
                        found[then].add(first)
            self._before[direction] = found
        return found

    def descendants(self, start: NodeId) -> set[NodeId]:
        seen = {start}
        queue = deque([start])
        while queue:
            for nxt in self.after[queue.popleft()]:
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        return seen

    def put_last(self, node: NodeId, among: Iterable[NodeId], shutdown_only: bool = False) -> None:
        """Make ``node`` stop after every node of ``among`` that does not already come after it.

        Only nodes with no successor inside the candidate set get an edge; the rest
        are ordered through them, which keeps the plan readable.
        """
        later = self.descendants(node)
        candidates = {n for n in among if n not in later and n != node}
        for cand in candidates:
            if candidates.isdisjoint(self.after[cand]):
                self.edge(cand, node, need=False, shutdown_only=shutdown_only)


def build_graph(
    site: SiteConfig, inventory: Mapping[ResourceId, list[Target]] | None = None
) -> ResourceGraph:
    graph = ResourceGraph()
    members: dict[ResourceId, list[NodeId]] = {}
    found = inventory or {}
    for res in site.resources:
        members[res.id] = _add_resource_nodes(
            graph, res.id, res.kind, res.platform, res.count, found.get(res.id)
        )
    _dependency_edges(site, graph, members)
    _placement_edges(site, graph, members)
    _cluster_edges(site, graph, members)
    _last_rules(site, graph, members)
    return graph


def _add_resource_nodes(
    graph: ResourceGraph,
    rid: ResourceId,
    kind: ResourceKind,
    platform: str | None,
    count: int | None,
    targets: list[Target] | None,
) -> list[NodeId]:
    if kind is ResourceKind.VM_GROUP and targets is not None:
        ids = []
        for target in targets:
            nid = f"{rid}/{target.name}"
            graph.add(Node(nid, rid, ResourceKind.VM, platform, (target,)))
            ids.append(nid)
        return ids
    size = count if count is not None else 1
    graph.add(Node(rid, rid, kind, platform, tuple(targets or ()), size))
    return [rid]


def _dependency_edges(
    site: SiteConfig, graph: ResourceGraph, members: dict[ResourceId, list[NodeId]]
) -> None:
    for res in site.resources:
        for dep in res.depends_on:
            for a in members[res.id]:
                for b in members[dep]:
                    graph.edge(a, b)


def _placement_edges(
    site: SiteConfig, graph: ResourceGraph, members: dict[ResourceId, list[NodeId]]
) -> None:
    """A VM stops before its host; VMs of unknown placement before every host of their platform
    (a controller's machine live inventory finds on a host that is no resource is placed: it
    waits for none)."""
    host_by_name = {r.target_name: r.id for r in site.resources if r.kind is ResourceKind.HOST}
    controllers = {r.id for r in site.resources if r.runs_upsguard}
    if site.ha is not None and site.ha.peer_machine is not None:
        controllers.add(site.ha.peer_machine)

    unplaced: dict[str, list[NodeId]] = {}
    for res in site.resources:
        if res.kind not in (ResourceKind.VM, ResourceKind.VM_GROUP):
            continue
        for nid in members[res.id]:
            # where live inventory found it, else where the site file says it runs
            targets = graph.nodes[nid].targets
            hosts = _hosts_from_targets(graph.nodes[nid], host_by_name) or list(res.runs_on)
            for host in hosts:
                graph.edge(nid, host)
            # a controller's machine live inventory placed on hosts upsguard does not stop
            # waits for none: it stops last (``_last_rules``), not before every host
            elsewhere = res.id in controllers and bool(targets) and all(t.host for t in targets)
            if not hosts and not elsewhere and res.platform is not None:
                unplaced.setdefault(res.platform, []).append(nid)
    for platform, vms in unplaced.items():
        hosts = [h.id for h in site.hosts_of_platform(platform)]
        if not hosts:
            continue
        barrier = f"{platform}:vms-of-unknown-placement"
        graph.add(
            Node(
                barrier,
                ResourceId(barrier),
                ResourceKind.COMMAND,
                None,
                barrier=True,
                gathers=platform,
            )
        )
        for vm in vms:
            graph.edge(vm, barrier)
        for host in hosts:
            graph.edge(barrier, host)


def _cluster_edges(
    site: SiteConfig, graph: ResourceGraph, members: dict[ResourceId, list[NodeId]]
) -> None:
    """A cluster's own state, in the order its vendor documents a cluster shutdown (Proxmox
    VE: ha-manager, pveceph "Shutdown"): HA disarmed before any guest of the platform stops
    (it would restart or move them), the Ceph flags set once every guest is down and before
    any node stops, and the nodes running a Ceph monitor after those that do not (the
    monitors keep their quorum until the end). These order the plan; none is a need. A
    startup mirrors them: monitor nodes first, the flags unset, the guests in their order,
    and HA re-armed once they are up (armed first, it would start them all at once, ahead
    of their dependencies)."""
    for res in site.resources:
        if res.kind is not ResourceKind.CLUSTER or res.platform is None:
            continue
        mine = [n for n in graph.nodes.values() if n.platform == res.platform and not n.barrier]
        own = {r.id for r in site.resources if r.runs_upsguard}
        guests = [
            n.id
            for n in mine
            if n.kind in (ResourceKind.VM, ResourceKind.VM_GROUP) and n.resource not in own
        ]
        hosts = [n.id for n in mine if n.kind is ResourceKind.HOST]
        for nid in members[res.id]:
            if res.cluster == "ha":
                for guest in guests:
                    graph.edge(nid, guest, need=False)
            else:
                for guest in guests:
                    graph.edge(guest, nid, need=False)
            for host in hosts:  # the cluster's state needs its quorum: before any node
                graph.edge(nid, host, need=False)
        _state_before_flags(site, graph, members, res.platform)
    _monitors_last(site, graph, members)


def _state_before_flags(
    site: SiteConfig, graph: ResourceGraph, members: dict[ResourceId, list[NodeId]], platform: str
) -> None:
    """HA is disarmed before the Ceph flags are set (and re-armed after they are unset)."""
    of = [r for r in site.resources if r.kind is ResourceKind.CLUSTER and r.platform == platform]
    for ha in (r for r in of if r.cluster == "ha"):
        for flags in (r for r in of if r.cluster == "ceph_flags"):
            for a in members[ha.id]:
                for b in members[flags.id]:
                    graph.edge(a, b, need=False)


def _monitors_last(
    site: SiteConfig, graph: ResourceGraph, members: dict[ResourceId, list[NodeId]]
) -> None:
    """The nodes of a platform without a Ceph monitor stop before those with one."""
    hosts = [r for r in site.resources if r.kind is ResourceKind.HOST]
    for monitor in (r for r in hosts if r.ceph_monitor):
        for other in hosts:
            mon = other.ceph_monitor or other.runs_upsguard  # upsguard's own node goes last
            if other.platform == monitor.platform and not mon:
                for a in members[other.id]:
                    for b in members[monitor.id]:
                        graph.edge(a, b, need=False)


def _hosts_from_targets(node: Node, host_by_name: dict[str, ResourceId]) -> list[ResourceId]:
    return sorted({host_by_name[t.host] for t in node.targets if t.host in host_by_name})


def _powered_on_apart(site: SiteConfig, graph: ResourceGraph, platform: str) -> set[NodeId]:
    """The hosts of a managed platform that come back without its manager: another platform
    (a BMC, Wake-on-LAN) powers them on, and upsguard reaches them directly (vSphere's
    ``direct_hosts``) to see them up. Their start does not wait for vCenter's."""
    if not site.platform(platform).reaches_hosts_directly:
        return set()
    index = site.resource_index()
    return {
        n.id
        for n in graph.nodes.values()
        if n.kind is ResourceKind.HOST
        and n.platform == platform
        and index[n.resource].power_on_via is not None
    }


def _last_rules(
    site: SiteConfig, graph: ResourceGraph, members: dict[ResourceId, list[NodeId]]
) -> None:
    """Managers after what they manage; switches after the rest; upsguard's own machine last,
    and the other controller's of a pair (``ha.peer_machine``) just before it: the two
    controllers' machines are the last two steps, so that one of them is always there to act
    and the second sends the UPS command that brings power back."""
    for res in site.resources:
        if res.serves_platform is None:
            continue
        managed = [
            n.id
            for n in graph.nodes.values()
            if n.platform == res.serves_platform and n.resource != res.id
        ]
        apart = _powered_on_apart(site, graph, res.serves_platform)
        for nid in members[res.id]:
            graph.put_last(nid, [n for n in managed if n not in apart])
            graph.put_last(nid, [n for n in managed if n in apart], shutdown_only=True)
    switches = {n.id for n in graph.nodes.values() if n.kind is ResourceKind.SWITCH}
    others = [n for n in graph.nodes if n not in switches]
    for sw in switches:
        graph.put_last(sw, others)
    own = [nid for res in site.resources if res.runs_upsguard for nid in members[res.id]]
    peer = site.ha.peer_machine if site.ha is not None else None
    if peer is not None and peer in members:  # the other controller's machine, just before
        for nid in members[peer]:
            graph.put_last(nid, [n for n in graph.nodes if n not in own])
    for nid in own:
        graph.put_last(nid, list(graph.nodes))
