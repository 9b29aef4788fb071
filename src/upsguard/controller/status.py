"""What ``upsguard status`` shows: phase, UPSes and feeds, the run with the step now running,
caches. Built from the live controller, or from the journal when the service is not running."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from upsguard.config.site import SiteConfig
from upsguard.controller.journal import Journal
from upsguard.controller.rows import iso
from upsguard.engine.outage_controller import OutageController


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """What the service says of itself: its process and its polls."""

    pid: int
    since: datetime
    polls: int
    resumed: str | None
    poll_interval_s: float


def service_status(
    site: SiteConfig,
    controller: OutageController,
    journal: Journal,
    info: ServiceInfo,
    alerts: list[str],
) -> dict[str, Any]:
    held_row = journal.hold() if controller.engine.held else None
    held = held_row.to_dict() if held_row else None
    if held is None and controller.engine.held:
        held = {"reason": controller.engine.held}
    return {
        "site": site.site,
        "service": {
            "running": True,
            "pid": info.pid,
            "since": iso(info.since),
            "journal": journal.path,
            "poll_interval_s": info.poll_interval_s,
            "polls": info.polls,
            "resumed": info.resumed,
        },
        "phase": controller.engine.phase.value,
        "phase_since": _phase_since(journal),
        "held": held,
        "at_floor": controller.engine.at_floor,
        "ups": ups_status(controller),
        "feeds": feeds_status(controller),
        "run": run_status(controller),
        "last_run": _last_run(journal),
        "caches": caches_status(controller),
        "alerts": [{"text": text} for text in [*alerts, *controller.alerts()]],
    }


def _phase_since(journal: Journal) -> str | None:
    phases = journal.phases(limit=1)
    return phases[0].at if phases else None


def _last_run(journal: Journal) -> dict[str, Any] | None:
    runs = journal.runs(limit=1, with_steps=False)
    return runs[0].to_dict() if runs else None


def ups_status(controller: OutageController) -> list[dict[str, Any]]:
    out = []
    for name, watch in controller.watches.items():
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


def feeds_status(controller: OutageController) -> list[dict[str, Any]]:
    view = controller.view
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


def run_status(controller: OutageController) -> dict[str, Any] | None:
    progress = controller.progress()
    if progress is None or controller.executor is None:
        return None
    by_id = controller.executor.plan.by_id()
    spec = progress.spec
    return {
        "run": spec.id,
        "direction": spec.direction.value,
        "kind": spec.kind.value,
        "origin": spec.origin.value,
        "steps": progress.total,
        "finished": len(progress.finished),
        "failed": sorted(s for s, state in progress.finished.items() if state == "failed"),
        "running": [
            {"step": s, "description": by_id[s].description} for s in progress.running if s in by_id
        ],
        "point_of_no_return": progress.point_of_no_return,
    }


def caches_status(controller: OutageController) -> list[dict[str, Any]]:
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
        for s in controller.caches.status.values()
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
