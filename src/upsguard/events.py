"""Typed events: the journal, the log, the notifier, metrics, the CLI and the simulator all
consume these, and ``describe`` gives each the one line a person reads.

A producer calls an ``EventSink`` synchronously, so that when the call returns the event
is recorded (a journal writes its row before the executor starts a step that depends on
the one just finished).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from upsguard.decisions import Outlook, Reckoning
from upsguard.findings import Finding, Verdict, counts
from upsguard.models import (
    CacheMode,
    CommandProcess,
    Direction,
    Phase,
    PowerState,
    ResourceId,
    ResourceKind,
    RunId,
    StepId,
    StepState,
    UpsFlag,
    UpsName,
    UpsReading,
)
from upsguard.runs import RunOutcome, RunSpec
from upsguard.selftest import TestState
from upsguard.units import format_bytes, format_duration

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Event:
    at: datetime

    @property
    def kind(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, slots=True)
class ReadingTaken(Event):
    reading: UpsReading


@dataclass(frozen=True, slots=True)
class OnBattery(Event):
    """A feed went at risk: too few of its UPSes supply from mains."""

    feed: str
    detail: str
    outlook: Outlook | None = None
    """When the feed's shutdown will start, as its triggers and figures stood then."""


@dataclass(frozen=True, slots=True)
class PowerRestored(Event):
    """A feed is supplied from mains again; the startup policy's timer counts from here."""

    feed: str
    outage_s: float | None = None
    """How long the feed was on battery (None when not seen go: a restarted controller)."""


@dataclass(frozen=True, slots=True)
class UpsFlagChanged(Event):
    """A UPS raised, or cleared, a status flag a person must hear of (``ALERT_FLAGS``): low
    battery, battery needs replacing, overload, bypass. Told once per change, not per poll."""

    ups: UpsName
    flag: UpsFlag
    raised: bool
    outlook: Outlook | None = None
    """For a low battery: the shutdown of the UPS's feed as its triggers see it now."""


ALERT_FLAGS = {
    UpsFlag.LB: "low battery",
    UpsFlag.RB: "battery needs replacing",
    UpsFlag.OVER: "overload",
    UpsFlag.BYPASS: "on bypass",
}
"""The status flags told as events, each with the words a person reads."""


@dataclass(frozen=True, slots=True)
class ContactLost(Event):
    """A UPS cannot be read (out of reach, refusing, or its data stale): an alert, told once
    until it answers again."""

    ups: UpsName
    why: str
    stale: bool = False
    """The source answers, but says its data is stale (NUT's DATA-STALE)."""
    was_on_battery: bool = False
    """Its last live reading said on battery: its countdown goes on from that runtime."""


@dataclass(frozen=True, slots=True)
class ContactBack(Event):
    """A UPS that could not be read answers again with fresh data."""

    ups: UpsName


@dataclass(frozen=True, slots=True)
class RedundancyLost(Event):
    """A feed has fewer UPSes on mains than it has, but still enough (``min_supplies``):
    nothing is at risk yet, but one failure more puts it on battery."""

    feed: str
    members: tuple[tuple[str, str], ...]
    """Each UPS of the feed and its word (``online``, ``on-battery``...), in order."""
    online: int
    needed: int


@dataclass(frozen=True, slots=True)
class RedundancyBack(Event):
    """Every UPS of a feed that had lost its redundancy is on mains again."""

    feed: str
    members: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PhaseChanged(Event):
    old: Phase
    new: Phase
    reason: str
    figures: Reckoning | None = None
    """The condition that moved the phase, with its figures (None for a person's act, power
    back, a finished run)."""


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    """A run's first step is about to start; ``resumed`` when a new process takes up a run
    an earlier one left unfinished."""

    spec: RunSpec
    steps: int
    resumed: bool = False

    @property
    def run(self) -> RunId:
        return self.spec.id

    @property
    def direction(self) -> Direction:
        return self.spec.direction


@dataclass(frozen=True, slots=True)
class RunFinished(Event):
    spec: RunSpec
    outcome: RunOutcome
    detail: str = ""

    @property
    def run(self) -> RunId:
        return self.spec.id

    @property
    def direction(self) -> Direction:
        return self.spec.direction


@dataclass(frozen=True, slots=True)
class PointOfNoReturn(Event):
    run: RunId
    step: StepId


@dataclass(frozen=True, slots=True)
class StepStarted(Event):
    run: RunId
    step: StepId
    action: str
    resource: ResourceId | None = None
    """The resource the step acts on (a group's member steps name their group)."""
    member: bool = False
    """The step acts on one VM of a group expanded from live inventory, not on the whole
    resource (``runbooks.plan.Step.member``)."""


@dataclass(frozen=True, slots=True)
class StepFinished(Event):
    run: RunId
    step: StepId
    state: StepState
    detail: str
    attempts: int = 1
    fallback_used: bool = False
    resource: ResourceId | None = None
    already_there: bool = False
    """Every target was in the wanted state already: nothing was asked of the platform (a
    VM already off, a resumed step re-checking what was done before)."""
    member: bool = False
    """As ``StepStarted.member``."""


@dataclass(frozen=True, slots=True)
class TargetAsked(Event):
    """A platform accepted a step's request for one target (to stop it, or to power it on).
    It is under way until the target is seen in the state asked for; journaled, so that a
    restarted controller waits for it instead of asking again."""

    run: RunId
    step: StepId
    platform: str
    target: str
    target_kind: ResourceKind
    wanted: PowerState
    process: CommandProcess | None = None
    """The request is a command running here (the ``command`` platform), journaled as it
    starts: a restarted controller waits for that process instead of starting another."""


@dataclass(frozen=True, slots=True)
class RequestFailed(Event):
    """A command a step sent to its target (``SendsCommands``) ran and failed (it exited
    non-zero): nothing is under way, and a restarted controller does not wait for it."""

    run: RunId
    step: StepId
    platform: str
    target: str


@dataclass(frozen=True, slots=True)
class RunWidened(Event):
    """A running shutdown's scope grew (another feed's trigger): the same run, more steps."""

    spec: RunSpec
    steps: int
    reason: str
    """Why it grew: the trigger of the feeds it covers now."""

    @property
    def run(self) -> RunId:
        return self.spec.id


@dataclass(frozen=True, slots=True)
class StepWaiting(Event):
    """A step is ready but held back, for example by a dirty cache."""

    run: RunId
    step: StepId
    reason: str


@dataclass(frozen=True, slots=True)
class CacheModeChanged(Event):
    cache: str
    target: str
    mode: CacheMode
    ok: bool
    detail: str = ""
    owed: bool = False
    """upsguard took the target out of write-back: it returns it once the outage is over."""


@dataclass(frozen=True, slots=True)
class CacheClean(Event):
    cache: str
    waited_s: float


@dataclass(frozen=True, slots=True)
class DestageProgress(Event):
    """A cache still dirty while a step waits on it: how much is left, how fast it drains,
    how long it will take at that rate (None while not measured yet). Told at a bounded
    rate (``engine.destage.PROGRESS_EVERY_S`` per cache), not on every poll."""

    cache: str
    dirty_bytes: int | None
    rate_bps: float | None
    eta_s: float | None


@dataclass(frozen=True, slots=True)
class RiskAccepted(Event):
    """upsguard went on with a cache still dirty, although data may be lost; always journaled,
    logged and notified."""

    cache: str
    dirty_bytes: int
    """What the cache held when the risk was taken (0 when its provider cannot tell)."""
    why: str
    """What let go: the critical floor, or the cache's destage timeout."""

    @property
    def what(self) -> str:
        held = format_bytes(self.dirty_bytes)
        return f"going on with cache {self.cache} still dirty ({held}): {self.why}"


@dataclass(frozen=True, slots=True)
class UpsCommandSent(Event):
    """An instant command sent to a UPS at the end of a shutdown, and whether it took it."""

    ups: str
    command: str
    ok: bool
    detail: str = ""
    """Why it failed (the UPS's or the source's own words); empty when it took it."""
    run: RunId | None = None
    cuts_not_known_off: tuple[str, ...] = ()
    """Resources it cuts that were not known off: sent at the battery's critical floor all
    the same (``engine.end_of_outage``); empty otherwise."""


@dataclass(frozen=True, slots=True)
class OverrideApplied(Event):
    """A person acted: hold, release, trigger, abort. ``who`` comes from the kernel (the API
    socket's peer) or the login of the CLI user, never from the request alone."""

    who: str
    action: str
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class LeadershipChanged(Event):
    """This controller of a pair changed role: ``standby``, ``leader``, ``fenced`` (it held
    the lease but could not renew it in time: it starts nothing) or ``finishing_alone``."""

    me: str
    role: str
    leader: str | None
    token: int | None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Notice(Event):
    """Anything else worth a line in the timeline."""

    message: str
    level: str = "info"
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CheckupDone(Event):
    """The service checked the site (``checks:``), as ``upsguard doctor`` does. ``broke``:
    what fails or warns now and did not at the last checkup (all that is wrong at the
    first); ``mended``: what was wrong then and is ok now."""

    findings: tuple[Finding, ...]
    broke: tuple[Finding, ...] = ()
    mended: tuple[Finding, ...] = ()
    took_s: float = 0.0


@dataclass(frozen=True, slots=True)
class BatteryTestStarted(Event):
    ups: UpsName
    test: str
    """``quick`` or ``deep``."""


@dataclass(frozen=True, slots=True)
class BatteryTestSkipped(Event):
    """A scheduled battery test that was not sent; it is tried again at its next time."""

    ups: UpsName
    test: str
    reason: str


@dataclass(frozen=True, slots=True)
class BatteryTestFinished(Event):
    """A battery test upsguard asked for came to its end (or was stopped, or never reported
    one within its timeout: ``state`` unknown). ``runtime_observed_s``: from a deep test,
    how long the battery would have lasted at the drain seen during the test."""

    ups: UpsName
    test: str
    started: datetime
    state: TestState
    text: str
    charge_start: float | None = None
    charge_end: float | None = None
    runtime_observed_s: float | None = None


RISK_PREFIX = "RISK: "
"""What a risk's line starts with, before ``RiskAccepted.what`` (a report shows the rest)."""


def describe(event: Event) -> str | None:
    """The line a person reads for this event; None for events too frequent to list."""
    match event:  # the step events first: a big site makes thousands of them
        case StepStarted(step=step, action=action):
            return f"  start {step} ({action})"
        case StepFinished(step=step, state=state, detail=detail):
            return f"  {state:<9} {step}{_then(detail)}"
        case PhaseChanged(old=old, new=new, reason=reason):
            return f"phase {old} -> {new}{_then(reason)}"
        case RunStarted(spec=spec, steps=steps, resumed=resumed):
            verb = "resumed" if resumed else "started"
            feeds = f", feeds {', '.join(spec.feeds)}" if spec.feeds else ""
            return f"{spec.kind} runbook {verb} ({steps} steps{feeds}): {spec.reason}  [{spec.id}]"
        case RunFinished(spec=spec, outcome=outcome, detail=detail):
            return f"{spec.kind} runbook {outcome}{_then(detail)}"
        case RunWidened(spec=spec, steps=steps, reason=reason):
            feeds = ", ".join(spec.feeds) if spec.feeds else "every feed"
            return f"{spec.kind} runbook widened to {feeds} ({steps} steps): {reason}  [{spec.id}]"
        case StepWaiting(step=step, reason=reason):
            return f"  waiting  {step}{_then(reason)}"
        case PointOfNoReturn(step=step):
            return f"point of no return: {step} starts"
        case CacheModeChanged(cache=cache, target=target, mode=mode, ok=ok, detail=detail):
            verdict = "" if ok else f" FAILED: {detail}"
            return f"cache {cache}/{target} -> {mode}{verdict}"
        case CacheClean(cache=cache, waited_s=waited):
            return f"cache {cache} clean (waited {format_duration(waited)})"
        case DestageProgress(cache=cache, dirty_bytes=dirty, rate_bps=rate, eta_s=eta):
            return _destage_line(cache, dirty, rate, eta)
        case OnBattery(feed=feed, detail=detail):
            return f"feed {feed} on battery: {detail}"
        case PowerRestored(feed=feed):
            return f"feed {feed} on mains again"
        case UpsFlagChanged(ups=ups, flag=flag, raised=raised):
            said = f"{ALERT_FLAGS.get(flag, flag.value)} ({flag.value})"
            return f"WARNING: UPS {ups}: {said}" if raised else f"UPS {ups}: no longer {said}"
        case ContactLost(ups=ups, why=why):
            return f"WARNING: UPS {ups} cannot be read: {why}"
        case ContactBack(ups=ups):
            return f"UPS {ups} answers again"
        case RedundancyLost(feed=feed, members=members, online=online, needed=needed):
            return (
                f"WARNING: feed {feed} has lost its redundancy: {members_line(members)} "
                f"({online} of {len(members)} UPSes on mains, {needed} needed)"
            )
        case RedundancyBack(feed=feed, members=members):
            return f"feed {feed} is redundant again: {members_line(members)}"
        case RiskAccepted():
            return RISK_PREFIX + event.what
        case UpsCommandSent(ups=ups, command=command, ok=ok, detail=detail):
            return f"UPS {ups}: sent {command}" if ok else f"UPS {ups}: {command} failed: {detail}"
        case OverrideApplied(who=who, action=action, reason=reason, detail=detail):
            text = f"override: {action} by {who}" + (f": {reason}" if reason else "")
            return text + (f" ({detail})" if detail else "")
        case LeadershipChanged(me=me, role=role, leader=leader, token=token, detail=detail):
            term = f", term {token}" if token is not None else ""
            who = f" ({leader} leads{term})" if leader and leader != me else term
            return f"pair: {me} is {role.replace('_', ' ')}{who}: {detail}"
        case Notice(message=message, level=level):
            return message if level == "info" else f"{level.upper()}: {message}"
        case CheckupDone():
            return _checkup_line(event)
        case BatteryTestStarted(ups=ups, test=test):
            return f"UPS {ups}: {test} battery test started"
        case BatteryTestSkipped(ups=ups, test=test, reason=reason):
            return f"UPS {ups}: {test} battery test not sent: {reason}"
        case BatteryTestFinished(ups=ups, test=test, state=state, text=text):
            observed = event.runtime_observed_s
            runtime = f", runtime observed {observed / 60:.0f} min" if observed else ""
            return f"UPS {ups}: {test} battery test {state.value} ({text}){runtime}"
    return None


def members_line(members: tuple[tuple[str, str], ...]) -> str:
    """Each UPS of a feed with its word: ``ups-a on-battery, ups-b online``."""
    return ", ".join(f"{ups} {word}" for ups, word in members)


def _then(detail: str) -> str:
    """``: detail``, or nothing when there is none (no line ends in a dangling colon)."""
    return f": {detail}" if detail else ""


def _checkup_line(event: CheckupDone) -> str:
    n = counts(event.findings)
    line = f"checks: {n[Verdict.OK]} ok, {n[Verdict.WARN]} warn, {n[Verdict.FAIL]} fail"
    if event.broke:
        shown = "; ".join(
            f"{f.area.value} {f.subject} {f.check} {f.verdict.value}: {f.detail}"
            for f in event.broke[:5]
        )
        more = f" (and {len(event.broke) - 5} more)" if len(event.broke) > 5 else ""
        line += f"; broke since the last checkup: {shown}{more}"
    if event.mended:
        line += "; mended: " + ", ".join(
            f"{f.area.value} {f.subject} {f.check}" for f in event.mended
        )
    return line


def _destage_line(cache: str, dirty: int | None, rate: float | None, eta: float | None) -> str:
    left = "dirty data unknown" if dirty is None else f"{format_bytes(dirty)} dirty"
    if not rate or rate <= 0 or eta is None:
        return f"cache {cache} destaging: {left}, rate not measured yet"
    minutes, seconds = divmod(round(eta), 60)
    took = f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
    return f"cache {cache} destaging: {left} at {format_bytes(rate)}/s, about {took} left"


def level(event: Event) -> str:
    """How loud an event is in the log and the journal: info, warning or error."""
    if isinstance(event, Notice):
        return event.level
    if isinstance(event, RiskAccepted):
        return "error"
    if isinstance(event, StepFinished) and event.state is StepState.FAILED:
        return "error"
    if isinstance(event, OverrideApplied | LeadershipChanged):
        return "warning"
    if isinstance(event, CacheModeChanged) and not event.ok:
        return "warning"
    if isinstance(event, UpsCommandSent) and not event.ok:
        return "error"
    if isinstance(event, OnBattery | ContactLost | RedundancyLost):
        return "warning"
    if isinstance(event, UpsFlagChanged) and event.raised:
        return "warning"
    if isinstance(event, CheckupDone) and event.broke:
        return "warning"
    if isinstance(event, BatteryTestFinished) and event.state in _BAD_TESTS:
        return "warning"
    return "info"


_BAD_TESTS = (TestState.FAILED, TestState.WARNING, TestState.UNKNOWN)


EventSink = Callable[[Event], None]


class EventBus:
    """Fans one event out to every subscriber, in subscription order.

    A subscriber that raises is that subscriber's bug, logged: it never keeps the others
    from hearing the event, nor fails the step or the decision that told it.
    """

    def __init__(self) -> None:
        self._sinks: list[EventSink] = []

    def subscribe(self, sink: EventSink) -> None:
        self._sinks.append(sink)

    def __call__(self, event: Event) -> None:
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                log.exception("%s failed on %s", getattr(sink, "__qualname__", sink), event.kind)
