"""Plans as text, JSON, Graphviz dot and Mermaid."""

from __future__ import annotations

import json
from typing import Any

from upsguard.config.types import format_duration
from upsguard.runbooks.plan import Action, Plan, Step
from upsguard.units import counted

MAX_WAITS_SHOWN = 4


def plan_text(plan: Plan) -> str:
    critical = set(plan.critical_path)
    lines = [
        f"{plan.direction.value} plan: {counted(len(plan.steps), 'step')}, "
        f"about {format_duration(plan.estimate_s)} with the parallelism limits "
        f"(critical path {format_duration(plan.critical_path_s)})",
        "limits: " + (", ".join(f"{p} {n} at once" for p, n in plan.limits.items()) or "none"),
        "",
    ]
    width = max((len(s.id) for s in plan.steps), default=10)
    source_width = max((len(s.estimate_source) for s in plan.steps), default=7) + 2
    for index, step in enumerate(plan.steps, 1):
        mark = "*" if step.id in critical else " "
        source = f"({step.estimate_source})"
        head = (
            f"{index:>4} {mark} {step.id:<{width}}  ~{format_duration(step.estimate_s):>6}"
            f" {source:<{source_width}}  "
        )
        lines.append(head + step.description)
        extra = _step_extras(step)
        if extra:
            lines.append(" " * len(head) + extra)
    lines.append("")
    lines.append("* = on the critical path: " + " -> ".join(plan.critical_path))
    lines.extend(f"note: {n}" for n in plan.notes)
    return "\n".join(lines)


def _step_extras(step: Step) -> str:
    parts = []
    if step.waits_for:
        shown = ", ".join(step.waits_for[:MAX_WAITS_SHOWN])
        more = len(step.waits_for) - MAX_WAITS_SHOWN
        parts.append(f"waits for {shown}" + (f" (+{more} more)" if more > 0 else ""))
    if step.caches:
        parts.append("after caches clean: " + ", ".join(step.caches))
    if step.is_point_of_no_return and step.id.startswith("stop:"):
        parts.append("point of no return")
    if step.quorum_ends is not None:
        q = step.quorum_ends
        parts.append(
            f"cluster {q.platform} loses its quorum here ({q.down} of {q.nodes} nodes down): "
            "its HA and Ceph steps come before"
        )
    if step.configured_s is not None:
        parts.append(f"learned below the configured {format_duration(step.configured_s)}")
    return "; ".join(parts)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan_dict(plan), indent=2)


def plan_dict(plan: Plan) -> dict[str, Any]:
    return {
        "direction": plan.direction.value,
        "estimate_s": plan.estimate_s,
        "estimate_sources": _source_counts(plan),
        "critical_path_s": plan.critical_path_s,
        "critical_path": list(plan.critical_path),
        "limits": plan.limits,
        "left_to_ups": list(plan.left_to_ups),
        "notes": list(plan.notes),
        "steps": [
            {
                "id": s.id,
                "resource": s.resource,
                "kind": s.kind.value,
                "platform": s.platform,
                "action": s.action.value,
                "waits_for": list(s.waits_for),
                "estimate_s": s.estimate_s,
                "estimate_source": s.estimate_source,
                "learned_s": s.learned.p90_s if s.learned is not None else None,
                "configured_s": s.configured_s,
                "count": s.members,
                "caches": list(s.caches),
                "direct": s.direct,
                "power_via": s.settings.power_on_via if s.settings else None,
                "quorum_ends": s.quorum_ends.platform if s.quorum_ends else None,
                "description": s.description,
            }
            for s in plan.steps
        ],
    }


def _source_counts(plan: Plan) -> dict[str, int]:
    """How many steps took their estimate from each source (learned ones count as
    ``learned``)."""
    counts: dict[str, int] = {}
    for step in plan.steps:
        if step.action is Action.BARRIER:
            continue
        key = "learned" if step.learned is not None else step.estimate_source
        counts[key] = counts.get(key, 0) + 1
    return counts


def plan_dot(plan: Plan) -> str:
    critical = set(plan.critical_path)
    lines = [f'digraph "{plan.direction.value}" {{', "  rankdir=LR;", "  node [shape=box];"]
    for s in plan.steps:
        style = ", style=bold, color=red" if s.id in critical else ""
        label = f"{_dot(s.id)}\\n~{format_duration(s.estimate_s)}"
        lines.append(f'  "{_dot(s.id)}" [label="{label}"{style}];')
        lines.extend(f'  "{_dot(w)}" -> "{_dot(s.id)}";' for w in s.waits_for)
    lines.append("}")
    return "\n".join(lines)


def _dot(text: str) -> str:
    """Text inside a DOT quoted string: a ``"`` would end it, and a ``\\`` escape what
    follows (the closing quote, or an ``n`` into a line break in a label)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def plan_mermaid(plan: Plan) -> str:
    ids = {s.id: f"s{i}" for i, s in enumerate(plan.steps)}
    lines = ["flowchart LR"]
    for s in plan.steps:
        lines.append(f'  {ids[s.id]}["{_mermaid(s.id)} ~{format_duration(s.estimate_s)}"]')
        lines.extend(f"  {ids[w]} --> {ids[s.id]}" for w in s.waits_for)
    critical = [ids[c] for c in plan.critical_path]
    if critical:
        lines.append("  classDef critical stroke:#d00,stroke-width:3px")
        lines.append(f"  class {','.join(critical)} critical")
    return "\n".join(lines)


def _mermaid(text: str) -> str:
    """Text inside a Mermaid ``["..."]`` label, which knows no backslash escape: ``"`` and
    ``#`` (which starts one of its entity codes) as entity codes."""
    return text.replace("#", "#35;").replace('"', "#quot;")
