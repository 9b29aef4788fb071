"""Manual overrides: hold, release, trigger, abort. Every one is journaled with who and why.

The API calls these on the running service; the CLI calls the same functions
on a service it builds itself when none is running (after a confirmation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from upsguard.config.source import suggest
from upsguard.errors import PermanentError
from upsguard.models import ResourceId
from upsguard.runbooks.plan import Direction

if TYPE_CHECKING:
    from upsguard.controller.service import Service


def hold(svc: Service, who: str, reason: str) -> dict[str, Any]:
    if not reason.strip():
        raise PermanentError("hold needs a reason: upsguard hold --reason 'why'")
    svc.outage.engine.hold(reason)
    svc.journal.override(svc.clock.now(), who, "hold", reason)
    return {"held": True, "reason": reason}


def release(svc: Service, who: str, reason: str = "") -> dict[str, Any]:
    was = svc.outage.engine.held
    svc.outage.engine.release()
    svc.journal.override(svc.clock.now(), who, "release", reason, f"was held: {was}" if was else "")
    return {"held": False, "was": was}


def check_only(svc: Service, only: Sequence[str]) -> list[ResourceId]:
    known = [r.id for r in svc.site.resources]
    for rid in only:
        if rid not in known:
            raise PermanentError(f"unknown resource '{rid}'{suggest(rid, known)}")
    return [ResourceId(r) for r in only]


async def trigger(
    svc: Service, who: str, direction: str, only: Sequence[str], reason: str
) -> dict[str, Any]:
    if direction not in ("shutdown", "startup"):
        raise PermanentError(f"trigger: '{direction}' is neither shutdown nor startup")
    chosen = check_only(svc, only)
    why = reason or f"asked for by {who}"
    detail = "only " + ", ".join(chosen) if chosen else "whole site"
    svc.journal.override(svc.clock.now(), who, f"trigger {direction}", why, detail)
    run = await svc.outage.trigger(Direction(direction), chosen or None, why)
    return {"run": run, "direction": direction, "only": chosen}


async def abort(svc: Service, who: str, reason: str) -> dict[str, Any]:
    """Cancel the run in progress and hold, so the policy does not start it again at once."""
    loop = svc.outage
    why = reason or f"aborted by {who}"
    run = await loop.abort()
    hold_reason = f"abort by {who}: {why}"
    loop.engine.hold(hold_reason)
    detail = f"run {run} cancelled" if run else "no run was in progress"
    svc.journal.override(svc.clock.now(), who, "abort", why, detail)
    svc.journal.override(svc.clock.now(), who, "hold", hold_reason, "implied by abort")
    return {"aborted": run, "held": hold_reason}
