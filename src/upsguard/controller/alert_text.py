"""The words of the alerts: each event a person must hear of, as an ``Alert`` that says what
happened and what upsguard will do next, and when.

============================  ==========================================================
alert                         from
============================  ==========================================================
on battery, on mains          ``OnBattery`` (with its outlook), ``PowerRestored``, per feed
low battery                   ``UpsFlagChanged`` LB (with its feed's outlook), per UPS
replace battery               ``UpsFlagChanged`` RB, or a battery test that failed
overload, bypass              ``UpsFlagChanged`` OVER, BYPASS (and each cleared)
contact lost, stale, back     ``ContactLost`` (``stale``), ``ContactBack``
redundancy lost, back         ``RedundancyLost``, ``RedundancyBack``
run started, ended, failed    ``RunStarted``, ``RunFinished``
cache left in write-through   ``CacheModeChanged`` back to write-back refused (and then taken)
risk                          ``RiskAccepted``
============================  ==========================================================

The words come from the events' typed fields and the site's policies, never from an event's
text. A figure that is not known is said to be unknown.
"""

from __future__ import annotations

from dataclasses import replace

from upsguard.config.policies import PoliciesConfig
from upsguard.config.service import AlertLevel
from upsguard.config.types import format_duration
from upsguard.controller.alerts import LEVELS, Alert, AlertKind
from upsguard.decisions import Outlook
from upsguard.engine.destage import RETRY_S
from upsguard.events import (
    BatteryTestFinished,
    CacheModeChanged,
    ContactBack,
    ContactLost,
    Event,
    OnBattery,
    PowerRestored,
    RedundancyBack,
    RedundancyLost,
    RiskAccepted,
    RunFinished,
    RunStarted,
    UpsFlagChanged,
    members_line,
)
from upsguard.models import CacheMode, Direction, UpsFlag
from upsguard.runs import RunOutcome
from upsguard.selftest import TestState

_RAISED = {
    UpsFlag.LB: AlertKind.LOW_BATTERY,
    UpsFlag.RB: AlertKind.REPLACE_BATTERY,
    UpsFlag.OVER: AlertKind.OVERLOAD,
    UpsFlag.BYPASS: AlertKind.BYPASS,
}
_CLEARED = {
    UpsFlag.LB: AlertKind.LOW_BATTERY_CLEARED,
    UpsFlag.RB: AlertKind.REPLACE_BATTERY_CLEARED,
    UpsFlag.OVER: AlertKind.OVERLOAD_CLEARED,
    UpsFlag.BYPASS: AlertKind.BYPASS_CLEARED,
}


class AlertWriter:
    """Events into alerts, in the words of the site's policies (None: figures only)."""

    def __init__(self, site: str, policies: PoliciesConfig | None = None) -> None:
        self._site = site
        self._policies = policies
        self._stuck: set[str] = set()
        """Caches told left in write-through: their return to write-back is told too."""

    def alert(self, event: Event) -> Alert | None:
        match event:
            case OnBattery():
                return self._on_battery(event)
            case PowerRestored():
                return self._on_mains(event)
            case UpsFlagChanged():
                return self._flag(event)
            case BatteryTestFinished(state=TestState.FAILED):
                return self._test_failed(event)
            case ContactLost():
                return self._contact_lost(event)
            case ContactBack(ups=ups):
                what = f"UPS {ups} answers again."
                nxt = "its readings count again"
                return self._make(event, AlertKind.CONTACT_BACK, ups, what[:-1], what, nxt)
            case RedundancyLost():
                return self._redundancy_lost(event)
            case RedundancyBack(feed=feed, members=members):
                what = f"Feed {feed} is redundant again: {members_line(members)}."
                headline = f"feed {feed} redundant again"
                return self._make(event, AlertKind.REDUNDANCY_BACK, feed, headline, what, _NOTHING)
            case RunStarted():
                return self._run_started(event)
            case RunFinished():
                return self._run_finished(event)
            case CacheModeChanged(mode=CacheMode.WRITE_BACK):
                return self._cache_back(event)
            case RiskAccepted(cache=cache):
                what = f"upsguard is {event.what}."
                nxt = "the shutdown goes on: what the cache still held may be lost"
                headline = f"RISK: cache {cache} still dirty"
                return self._make(event, AlertKind.RISK, cache, headline, what, nxt)
        return None

    def _make(
        self, event: Event, kind: AlertKind, subject: str, headline: str, what: str, nxt: str
    ) -> Alert:
        level: AlertLevel = LEVELS.get(kind, "info")
        return Alert(kind, subject, level, headline, what, _sentence(nxt), event.at, self._site)

    # -- power ---------------------------------------------------------------------------

    def _on_battery(self, event: OnBattery) -> Alert:
        told = event.outlook
        left = "runtime left unknown" if told is None else _runtime(told.runtime_s)
        what = f"Feed {event.feed} is on battery ({event.detail}): {left}."
        nxt = f"{_shutdown_when(told)}, unless the mains return"
        if told is not None and told.due_now:
            nxt = _shutdown_when(told)
        nxt += self._write_through()
        return self._make(
            event, AlertKind.ON_BATTERY, event.feed, f"feed {event.feed} on battery", what, nxt
        )

    def _write_through(self) -> str:
        policies = self._policies
        if policies is None or "caches_write_through" not in policies.on_battery.then:
            return ""
        after = format_duration(policies.on_battery.after)
        return f"; write-back caches go to write-through after {after} on battery"

    def _on_mains(self, event: PowerRestored) -> Alert:
        took = "" if event.outage_s is None else f" after {_span(event.outage_s)} on battery"
        what = f"Feed {event.feed} is on mains again{took}."
        return self._make(
            event,
            AlertKind.ON_MAINS,
            event.feed,
            f"feed {event.feed} on mains again",
            what,
            self._after_power_back(),
        )

    def _after_power_back(self) -> str:
        policies = self._policies
        if policies is None:
            return (
                "a shutdown not past its point of no return is cancelled, one past it "
                "finishes and the startup follows; caches go back to write-back"
            )
        back = format_duration(policies.power_returns.online_for)
        cancel = policies.power_returns.before_point_of_no_return == "cancel"
        before = "is cancelled" if cancel else "finishes"
        startup = policies.startup
        if startup.automatic and "startup_runbook" in startup.then:
            then = (
                f"the startup runbook starts once the mains have stayed "
                f"{format_duration(startup.online_for)} and the charge is above "
                f"{startup.charge_above:.0f} %"
            )
        else:
            then = "the startup is left to a person (upsguard trigger startup)"
        return (
            f"once the mains have stayed {back}, a shutdown not past its point of no return "
            f"{before}; after a shutdown, {then}; the caches upsguard flipped go back to "
            "write-back"
        )

    # -- a UPS's flags ---------------------------------------------------------------------

    def _flag(self, event: UpsFlagChanged) -> Alert | None:
        ups = event.ups
        if not event.raised:
            kind = _CLEARED.get(event.flag)
            if kind is None:
                return None
            said = _FLAG_WORDS[event.flag]
            what = f"UPS {ups} no longer reports {said} ({event.flag.value})."
            return self._make(event, kind, ups, f"UPS {ups}: {said} cleared", what, _NOTHING)
        kind = _RAISED.get(event.flag)
        if kind is None:
            return None
        said = _FLAG_WORDS[event.flag]
        what = f"UPS {ups} reports {said} ({event.flag.value})."
        if event.flag is UpsFlag.LB:
            nxt = self._low_battery_next(event.outlook)
            return self._make(event, kind, ups, f"UPS {ups} low battery", what, nxt)
        return self._make(event, kind, ups, f"UPS {ups}: {said}", what, _FLAG_NEXT[event.flag])

    def _low_battery_next(self, told: Outlook | None) -> str:
        if told is None:
            return (
                "nothing by itself: no feed of this UPS is on battery (the others supply); "
                "if its feed goes on battery, the shutdown starts at once if low_battery is "
                "among its triggers"
            )
        return _shutdown_when(told)

    def _test_failed(self, event: BatteryTestFinished) -> Alert:
        ups = event.ups
        what = f"UPS {ups} failed its {event.test} battery test ({event.text})."
        return self._make(
            event,
            AlertKind.REPLACE_BATTERY,
            ups,
            f"UPS {ups}: battery needs replacing",
            what,
            _FLAG_NEXT[UpsFlag.RB],
        )

    # -- contact -------------------------------------------------------------------------

    def _contact_lost(self, event: ContactLost) -> Alert:
        ups = event.ups
        if event.stale:
            kind, headline = AlertKind.STALE_DATA, f"UPS {ups} data stale"
            what = f"UPS {ups}'s data is stale: its driver stopped updating it ({event.why})."
        else:
            kind, headline = AlertKind.CONTACT_LOST, f"UPS {ups} cannot be read"
            what = f"UPS {ups} cannot be read: {event.why}."
        return self._make(event, kind, ups, headline, what, self._lost_next(event))

    def _lost_next(self, event: ContactLost) -> str:
        if event.was_on_battery:
            return (
                "it was on battery: its countdown goes on from its last known runtime, and the "
                "shutdown starts by that count as if it were read"
            )
        policies = self._policies
        every = "" if policies is None else f" every {format_duration(policies.poll_interval)}"
        if policies is not None and policies.on_lost_contact_while_on_line == "treat_as_outage":
            return (
                f"it is asked again{every}; past its link grace it counts as on battery "
                "(on_lost_contact_while_on_line: treat_as_outage)"
            )
        return (
            f"nothing by itself: it counts as on mains, as last read, unless another UPS of "
            f"its feed fails; it is asked again{every}"
        )

    def _redundancy_lost(self, event: RedundancyLost) -> Alert:
        feed, total = event.feed, len(event.members)
        what = (
            f"Feed {feed} has lost its redundancy: {members_line(event.members)} "
            f"({event.online} of {total} UPSes on mains, {event.needed} needed)."
        )
        spare = event.online - event.needed + 1
        ups = "UPS" if spare == 1 else "UPSes"
        nxt = (
            f"nothing yet: the feed is supplied; if {spare} more {ups} go off mains it is on "
            "battery and its shutdown countdown starts"
        )
        return self._make(
            event, AlertKind.REDUNDANCY_LOST, feed, f"feed {feed} lost its redundancy", what, nxt
        )

    # -- runs and caches -----------------------------------------------------------------

    def _run_started(self, event: RunStarted) -> Alert:
        spec = event.spec
        verb = "resumed" if event.resumed else "started"
        feeds = f", feeds {', '.join(spec.feeds)}" if spec.feeds else ""
        what = f"The {spec.kind} runbook {verb} ({event.steps} steps{feeds}): {spec.reason}."
        if spec.direction is Direction.SHUTDOWN:
            nxt = (
                "guests stop first, hosts and storage once the caches in their data path are "
                "clean; upsguard status shows its progress, upsguard abort stops it"
            )
        else:
            nxt = (
                "hosts and storage start first, then what runs on them, each once what it "
                "needs is up; upsguard status shows its progress"
            )
        return self._make(
            event, AlertKind.RUN_STARTED, spec.id, f"{spec.kind} runbook {verb}", what, nxt
        )

    def _run_finished(self, event: RunFinished) -> Alert:
        spec, outcome = event.spec, event.outcome
        detail = f": {event.detail}" if event.detail else ""
        what = f"The {spec.kind} runbook {outcome.value}{detail}."
        if outcome is RunOutcome.FAILED:
            nxt = (
                f"what failed may still be running or off: upsguard history shows run {spec.id} "
                "step by step; fix it by hand or run the runbook again"
            )
            return self._make(
                event, AlertKind.RUN_FAILED, spec.id, f"{spec.kind} runbook FAILED", what, nxt
            )
        nxt = self._after_run(spec.direction, outcome)
        headline = f"{spec.kind} runbook {outcome.value}"
        ended = self._make(event, AlertKind.RUN_ENDED, spec.id, headline, what, nxt)
        return ended if outcome is RunOutcome.DONE else replace(ended, level="warning")

    def _after_run(self, direction: Direction, outcome: RunOutcome) -> str:
        if outcome is RunOutcome.INTERRUPTED:
            return "the service stopped while it ran; its next start resumes it"
        if outcome is RunOutcome.ABORTED:
            return "a person stopped it; automatic actions are held until upsguard release"
        if outcome is not RunOutcome.DONE:
            return "nothing more of it is done; the power watch goes on deciding"
        if direction is Direction.STARTUP:
            return "nothing: the site is back to normal"
        return f"the site stays down until the mains return; then {self._after_power_back()}"

    def _cache_back(self, event: CacheModeChanged) -> Alert | None:
        name = f"{event.cache}/{event.target}"
        if event.ok:
            if name not in self._stuck:
                return None
            self._stuck.discard(name)
            what = f"Cache {name} is back in write-back."
            return self._make(
                event,
                AlertKind.CACHE_WRITE_BACK,
                name,
                f"cache {name} back in write-back",
                what,
                _NOTHING,
            )
        self._stuck.add(name)
        why = f": {event.detail}" if event.detail else ""
        what = f"Cache {name} did not go back to write-back after the outage{why}."
        nxt = (
            f"it stays in write-through (safe, slower); upsguard asks again every "
            f"{RETRY_S:.0f} s until it takes it (or: upsguard cache set {event.cache} write-back)"
        )
        return self._make(
            event,
            AlertKind.CACHE_WRITE_THROUGH,
            name,
            f"cache {name} left in write-through",
            what,
            nxt,
        )


_NOTHING = "nothing to do"

_FLAG_WORDS = {
    UpsFlag.LB: "low battery",
    UpsFlag.RB: "battery needs replacing",
    UpsFlag.OVER: "overload",
    UpsFlag.BYPASS: "bypass",
}
_FLAG_NEXT = {
    UpsFlag.RB: (
        "nothing automatic: replace the battery; until then its runtime may end sooner than "
        "it says, and the shutdown would start late"
    ),
    UpsFlag.OVER: (
        "nothing automatic: lower the load; on battery its runtime is shorter than the "
        "model's, and the UPS may cut the load"
    ),
    UpsFlag.BYPASS: (
        "nothing automatic: the load is fed straight from the mains, unprotected; a mains "
        "failure now cuts it at once, before any shutdown can run"
    ),
}


def _shutdown_when(told: Outlook | None) -> str:
    """When the shutdown starts, as an outlook tells it; unknown when it cannot."""
    if told is None:
        return "when the shutdown starts is unknown"
    if told.due_now:
        return f"the shutdown starts now ({told.condition})"
    if told.condition is None or told.fires_in_s is None or told.limit is None:
        return "when the shutdown starts is unknown: no trigger can be counted down yet"
    soon = f"in about {_span(told.fires_in_s)}"
    if told.metric == "runtime":
        return f"the shutdown starts at {_span(told.limit)} left ({soon})"
    if told.metric == "charge":
        return f"the shutdown starts at {told.limit:.0f} % charge ({soon} at the present drain)"
    if told.metric == "on_battery_for":
        return f"the shutdown starts after {_span(told.limit)} on battery ({soon})"
    return f"the shutdown starts when {told.condition} ({soon})"


def _runtime(runtime_s: float | None) -> str:
    return "runtime left unknown" if runtime_s is None else f"{_span(runtime_s)} left"


def _span(seconds: float) -> str:
    """``11 min``, ``90 s``: a length as an alert says it (minutes from two on)."""
    if seconds < 120:
        return f"{max(0.0, seconds):.0f} s"
    return f"{round(seconds / 60)} min"


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
