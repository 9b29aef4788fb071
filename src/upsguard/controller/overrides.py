"""Manual overrides: hold, release, trigger, abort. Each is an ``OverrideApplied`` event with
who and why, so the journal, the log, metrics and the notifier all hear of it.

The API and the web page hand these a request read by ``controller.commands`` (``apply``);
the CLI calls the same ones on a service it builds itself when none is running (after a
confirmation). Requests and answers are ``commands``' types, whoever asks.
"""

from __future__ import annotations

from collections.abc import Sequence

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.config.source import suggest
from upsguard.controller.commands import (
    Abort,
    AbortAnswer,
    Answer,
    Hold,
    HoldAnswer,
    Release,
    ReleaseAnswer,
    Request,
    Trigger,
    TriggerAnswer,
)
from upsguard.engine.outage_controller import OutageController
from upsguard.errors import BadRequest
from upsguard.events import EventSink, OverrideApplied
from upsguard.models import ResourceId


class Overrides:
    def __init__(
        self, site: SiteConfig, controller: OutageController, events: EventSink, clock: Clock
    ) -> None:
        self._site = site
        self._controller = controller
        self._events = events
        self._clock = clock

    async def apply(self, request: Request) -> Answer:
        """Carry out a request the API or the page read (``commands.parse``)."""
        match request:
            case Hold():
                return self._hold(request)
            case Release():
                return self._release(request)
            case Trigger():
                return await self._trigger(request)
            case Abort():
                return await self._abort(request)

    def hold(self, who: str, reason: str) -> HoldAnswer:
        return self._hold(Hold.of(who, reason))

    def release(self, who: str, reason: str = "") -> ReleaseAnswer:
        return self._release(Release.of(who, reason))

    async def trigger(
        self, who: str, direction: str, only: Sequence[str], reason: str
    ) -> TriggerAnswer:
        return await self._trigger(Trigger.of(who, direction, only, reason))

    async def abort(self, who: str, reason: str) -> AbortAnswer:
        return await self._abort(Abort.of(who, reason))

    def _applied(self, who: str, action: str, reason: str, detail: str = "") -> None:
        self._events(OverrideApplied(self._clock.now(), who, action, reason, detail))

    def _hold(self, request: Hold) -> HoldAnswer:
        self._controller.hold(request.reason)
        self._applied(request.who, "hold", request.reason)
        return HoldAnswer(reason=request.reason)

    def _release(self, request: Release) -> ReleaseAnswer:
        was = self._controller.held
        self._controller.release()
        self._applied(request.who, "release", request.reason, f"was held: {was}" if was else "")
        return ReleaseAnswer(was=was)

    def _check_only(self, only: Sequence[str]) -> list[ResourceId]:
        known = [r.id for r in self._site.resources]
        for rid in only:
            if rid not in known:
                raise BadRequest(f"unknown resource '{rid}'{suggest(rid, known)}")
        return [ResourceId(r) for r in only]

    async def _trigger(self, request: Trigger) -> TriggerAnswer:
        who, direction = request.who, request.direction
        chosen = self._check_only(request.only)
        why = request.reason or f"asked for by {who}"
        detail = "only " + ", ".join(chosen) if chosen else "whole site"
        self._applied(who, f"trigger {direction}", why, detail)
        run = await self._controller.trigger(direction, chosen or None, why)
        return TriggerAnswer(run=run, direction=direction, only=chosen)

    async def _abort(self, request: Abort) -> AbortAnswer:
        """Cancel the run in progress and hold, so the policy does not start it again at once."""
        who = request.who
        why = request.reason or f"aborted by {who}"
        run = await self._controller.abort()
        hold_reason = f"abort by {who}: {why}"
        self._controller.hold(hold_reason)
        self._applied(
            who, "abort", why, f"run {run} cancelled" if run else "no run was in progress"
        )
        self._applied(who, "hold", hold_reason, "implied by abort")
        return AbortAnswer(aborted=run, held=hold_reason)
