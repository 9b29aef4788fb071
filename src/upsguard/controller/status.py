"""What ``upsguard status`` shows: phase, UPSes and feeds, the run with the step now running,
caches. Built from the live service, or from the journal when the service is not running."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from upsguard.controller.journal import Journal
from upsguard.controller.rows import iso
from upsguard.engine.outage_controller import OutageLoop

if TYPE_CHECKING:
    from upsguard.controller.service import Service


def service_status(svc: Service) -> dict[str, Any]:
    loop = svc.outage
    held_row = svc.journal.hold() if loop.engine.held else None
    held = held_row.to_dict() if held_row else None
    if held is None and loop.engine.held:
        held = {"reason": loop.engine.held}
    return {
        "site": svc.site.site,
        "service": {
            "running": True,
            "pid": os.getpid(),
            "since": iso(svc.started),
            "journal": svc.journal.path,
            "poll_interval_s": svc.site.policies.poll_interval.total_seconds(),
            "polls": svc.ticks,
            "resumed": svc.resumed,
        },
        "phase": loop.engine.phase.value,
        "phase_since": _phase_since(svc.journal),
        "held": held,
        "at_floor": loop.engine.at_floor,
        "ups": ups_status(loop),
        "feeds": feeds_status(loop),
        "run": run_status(loop),
        "last_run": _last_run(svc.journal),
        "caches": caches_status(loop),
    }


def _phase_since(journal: Journal) -> str | None:
    phases = journal.phases(limit=1)
    return phases[0].at if phases else None


def _last_run(journal: Journal) -> dict[str, Any] | None:
    runs = journal.runs(limit=1, with_steps=False)
    return runs[0].to_dict() if runs else None


def ups_status(loop: OutageLoop) -> list[dict[str, Any]]:
    out = []
    for name, watch in loop.watches.items():
        last = watch.last
        entry: dict[str, Any] = {"name": name, "polled": last is not None}
        if last is not None:
            entry.update(
                status=" ".join(sorted(f.value for f in last.flags)),
                charge_pct=last.charge_pct,
                runtime_s=watch.runtime_s(),
                reported_runtime_s=last.runtime_s,
                depletion_pct_per_min=watch.depletion_pct_per_min,
                load_pct=last.load_pct,
                input_voltage=last.input_voltage,
                link=last.link.value,
                age_s=last.age_s if last.age_s != float("inf") else None,
                at=iso(last.at),
            )
        if watch.last_error:
            entry["error"] = watch.last_error
        out.append(entry)
    return out


def feeds_status(loop: OutageLoop) -> list[dict[str, Any]]:
    view = loop.view
    if view is None:
        return []
    return [
        {
            "name": f.name,
            "at_risk": f.at_risk,
            "online": f.online,
            "needed": f.needed,
            "runtime_s": f.runtime_s,
            "charge_pct": f.charge_pct,
            "low_battery": f.low_battery,
            "lost": f.lost,
        }
        for f in view.feeds
    ]


def run_status(loop: OutageLoop) -> dict[str, Any] | None:
    progress = loop.progress()
    if progress is None or not loop.busy or loop.executor is None:
        return None
    plan = loop.executor.plan
    by_id: dict[str, Any] = {str(k): v for k, v in plan.by_id().items()}
    return {
        "run": progress.run,
        "direction": progress.direction,
        "kind": progress.kind,
        "origin": progress.origin,
        "steps": progress.total,
        "finished": len(progress.finished),
        "failed": sorted(s for s, state in progress.finished.items() if state == "failed"),
        "running": [
            {"step": s, "description": by_id[s].description} for s in progress.running if s in by_id
        ],
        "point_of_no_return": progress.point_of_no_return,
    }


def caches_status(loop: OutageLoop) -> list[dict[str, Any]]:
    return [
        {
            "cache": s.cache,
            "target": s.target.name,
            "mode": s.state.mode.value if s.state else None,
            "dirty_bytes": s.state.dirty_bytes if s.state else None,
            "clean": s.clean,
            "rate_bps": s.rate_bps,
            "eta_s": s.eta_s,
            "error": s.error,
        }
        for s in loop.caches.status.values()
    ]


def journal_status(journal: Journal, site: str) -> dict[str, Any]:
    """What the journal says when no service is running."""
    held = journal.hold()
    readings: dict[str, dict[str, Any]] = {}
    for row in journal.readings(limit=50):
        readings.setdefault(row.ups, row.to_dict())
    unfinished = [r.id for r in journal.runs(limit=20, with_steps=False) if r.unfinished]
    last_phase = journal.last_phase()
    return {
        "site": site,
        "service": {"running": False, "journal": journal.path},
        "phase": last_phase.value if last_phase else "normal",
        "phase_since": _phase_since(journal),
        "held": held.to_dict() if held else None,
        "last_readings": list(readings.values()),
        "last_run": _last_run(journal),
        "unfinished_runs": unfinished,
    }
