"""Ordering helpers over the resource graph: dropping nodes, topological order."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from upsguard.models import Direction
from upsguard.runbooks.graph import NodeId, ResourceGraph


def contract(
    graph: ResourceGraph, keep: set[NodeId], direction: Direction = Direction.SHUTDOWN
) -> dict[NodeId, set[NodeId]]:
    """What each kept node waits for (in stop order), passing through dropped nodes; for a
    startup, without the edges that order the shutdown alone (reverse it to start).

    If a must stop before b and b before c, dropping b still leaves c waiting for a.
    """
    before = graph.before(direction)
    memo: dict[NodeId, set[NodeId]] = {}

    def kept_before(node: NodeId) -> set[NodeId]:
        found = memo.get(node)
        if found is not None:
            return found
        if before[node] <= keep:  # the usual case: nothing to pass through
            memo[node] = set(before[node])
            return memo[node]
        result: set[NodeId] = set()
        stack = list(before[node])
        seen: set[NodeId] = set()
        while stack:
            prev = stack.pop()
            if prev in seen:
                continue
            seen.add(prev)
            if prev in keep:
                result.add(prev)
            elif prev in memo:
                result |= memo[prev]
            else:
                stack.extend(before[prev])
        memo[node] = result
        return result

    return {n: kept_before(n) for n in graph.nodes if n in keep}


def topological_order(
    waits: dict[NodeId, set[NodeId]], preference: Sequence[NodeId]
) -> list[NodeId]:
    """Kahn's order; among ready nodes the one earliest in ``preference`` goes first."""
    rank = {n: i for i, n in enumerate(preference)}
    dependents: dict[NodeId, list[NodeId]] = {n: [] for n in waits}
    missing = {n: len(w) for n, w in waits.items()}
    for node, ws in waits.items():
        for w in ws:
            dependents[w].append(node)
    ready = [rank[n] for n, count in missing.items() if count == 0]  # ranks: cheap to compare
    heapq.heapify(ready)
    order: list[NodeId] = []
    while ready:
        node = preference[heapq.heappop(ready)]
        order.append(node)
        for dep in dependents[node]:
            missing[dep] -= 1
            if missing[dep] == 0:
                heapq.heappush(ready, rank[dep])
    if len(order) != len(waits):
        stuck = sorted(n for n, c in missing.items() if c > 0)
        raise ValueError(f"the plan has a cycle through {', '.join(stuck[:5])}")
    return order
