"""Simulation reports as text and JSON."""

from __future__ import annotations

import dataclasses
import json

from upsguard.config.types import format_duration
from upsguard.simulation.simulator import Moment, SimulationReport


def report_text(report: SimulationReport) -> str:
    lines = [
        f"scenario: {report.scenario}",
        f"shutdown plan: about {format_duration(report.plan_estimate_s)} "
        f"(critical path {format_duration(report.plan_critical_path_s)})",
        "",
    ]
    lines += [moment_line(moment) for moment in report.timeline]
    lines.append("")
    lines.append(("OK: " if report.ok else "NOT OK: ") + report.verdict)
    lines.extend(f"  failed: {f}" for f in report.failed_steps)
    lines.extend(f"  risk: {r}" for r in report.risks)
    return "\n".join(lines)


def moment_line(moment: Moment) -> str:
    """One line of the timeline: when (``T+1h28m05s``), each UPS's charge and runtime, what
    happened. The columns are wide enough for a duration past an hour with its seconds, so
    they stay in place down a day-long timeline."""
    battery = "  ".join(
        f"{n} {c:5.1f}% {format_duration(r):>8}" for n, (c, r) in moment.battery.items()
    )
    return f"T+{format_duration(moment.at_s):>8}  [{battery}]  {moment.text}"


def report_json(report: SimulationReport) -> str:
    return json.dumps(
        {
            "scenario": report.scenario,
            "ok": report.ok,
            "verdict": report.verdict,
            "margin_s": report.margin_s,
            "required_margin_s": report.required_margin_s,
            "ran_out_at_s": report.ran_out_at_s,
            "ran_out_during": report.ran_out_during,
            "shutdown_finished_at_s": report.shutdown_finished_at_s,
            "needless": report.needless,
            "end_of_shutdown": (
                dataclasses.asdict(report.end_of_shutdown) if report.end_of_shutdown else None
            ),
            "lost_power": report.lost_power,
            "failed_steps": report.failed_steps,
            "risks": report.risks,
            "final_phase": report.final_phase,
            "plan_estimate_s": report.plan_estimate_s,
            "plan_critical_path_s": report.plan_critical_path_s,
            "timeline": [
                {
                    "at_s": m.at_s,
                    "kind": m.kind,
                    "text": m.text,
                    "battery": {
                        n: {"charge_pct": c, "runtime_s": r} for n, (c, r) in m.battery.items()
                    },
                }
                for m in report.timeline
            ],
        },
        indent=2,
    )
