"""Manual overrides: hold, release, trigger, abort. Each is an ``OverrideApplied`` event with
who and why, so the journal, the log, metrics and the notifier all hear of it.

The API calls these on the running service; the CLI calls the same ones on a service it
builds itself when none is running (after a confirmation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.config.source import suggest
from upsguard.engine.outage_controller import OutageController
from upsguard.errors import PermanentError
from upsguard.events import EventSink, OverrideApplied
from upsguard.models import Direction, ResourceId


class Overrides:
    def __init__(
        self, site: SiteConfig, controller: OutageController, events: EventSink, clock: Clock
    ) -> None:
        self._site = site
        self._controller = controller
        self._events = events
        self._clock = clock

    def _applied(self, who: str, action: str, reason: str, detail: str = "") -> None:
        self._events(OverrideApplied(self._clock.now(), who, action, reason, detail))

    def hold(self, who: str, reason: str) -> dict[str, Any]:
        if not reason.strip():
            raise PermanentError("hold needs a reason: upsguard hold --reason 'why'")
        self._controller.hold(reason)
        self._applied(who, "hold", reason)
        return {"held": True, "reason": reason}

    def release(self, who: str, reason: str = "") -> dict[str, Any]:
        was = self._controller.held
        self._controller.release()
        self._applied(who, "release", reason, f"was held: {was}" if was else "")
        return {"held": False, "was": was}

    def check_only(self, only: Sequence[str]) -> list[ResourceId]:
        known = [r.id for r in self._site.resources]
        for rid in only:
            if rid not in known:
                raise PermanentError(f"unknown resource '{rid}'{suggest(rid, known)}")
        return [ResourceId(r) for r in only]

    async def trigger(
        self, who: str, direction: str, only: Sequence[str], reason: str
    ) -> dict[str, Any]:
        if direction not in ("shutdown", "startup"):
            raise PermanentError(f"trigger: '{direction}' is neither shutdown nor startup")
        chosen = self.check_only(only)
        why = reason or f"asked for by {who}"
        detail = "only " + ", ".join(chosen) if chosen else "whole site"
        self._applied(who, f"trigger {direction}", why, detail)
        run = await self._controller.trigger(Direction(direction), chosen or None, why)
        return {"run": run, "direction": direction, "only": chosen}

    async def abort(self, who: str, reason: str) -> dict[str, Any]:
        """Cancel the run in progress and hold, so the policy does not start it again at once."""
        why = reason or f"aborted by {who}"
        run = await self._controller.abort()
        hold_reason = f"abort by {who}: {why}"
        self._controller.hold(hold_reason)
        self._applied(
            who, "abort", why, f"run {run} cancelled" if run else "no run was in progress"
        )
        self._applied(who, "hold", hold_reason, "implied by abort")
        return {"aborted": run, "held": hold_reason}
