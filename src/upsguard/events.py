"""Typed events: the journal, the log, the CLI and the simulator all consume these.

A producer calls an ``EventSink`` synchronously, so that when the call returns
the event is recorded (a journal writes its row before the executor starts a
step that depends on the one just finished).

Events are not changed once made, but they are not frozen dataclasses: a frozen
one costs four times as much to build, and a run of 5,000 steps makes 10,000.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from upsguard.models import CacheMode, Phase, StepId, StepState, UpsName, UpsReading


@dataclass(slots=True)
class Event:
    at: datetime

    @property
    def kind(self) -> str:
        return type(self).__name__


@dataclass(slots=True)
class ReadingTaken(Event):
    reading: UpsReading


@dataclass(slots=True)
class OnBattery(Event):
    ups: UpsName


@dataclass(slots=True)
class PowerRestored(Event):
    ups: UpsName


@dataclass(slots=True)
class LowBattery(Event):
    ups: UpsName


@dataclass(slots=True)
class PhaseChanged(Event):
    old: Phase
    new: Phase
    reason: str


@dataclass(slots=True)
class RunStarted(Event):
    run: str
    direction: str  # "shutdown" | "startup"
    steps: int
    reason: str


@dataclass(slots=True)
class RunFinished(Event):
    run: str
    direction: str
    state: str  # "done" | "failed" | "cancelled"
    detail: str = ""


@dataclass(slots=True)
class PointOfNoReturn(Event):
    run: str
    step: StepId


@dataclass(slots=True)
class StepStarted(Event):
    run: str
    step: StepId
    action: str


@dataclass(slots=True)
class StepFinished(Event):
    run: str
    step: StepId
    state: StepState
    detail: str
    attempts: int = 1
    fallback_used: bool = False


@dataclass(slots=True)
class StepWaiting(Event):
    """A step is ready but held back, for example by a dirty cache."""

    run: str
    step: StepId
    reason: str


@dataclass(slots=True)
class CacheModeChanged(Event):
    cache: str
    target: str
    mode: CacheMode
    ok: bool
    detail: str = ""


@dataclass(slots=True)
class CacheClean(Event):
    cache: str
    waited_s: float


@dataclass(slots=True)
class RiskAccepted(Event):
    """upsguard went on although data may be lost; always journaled and logged."""

    what: str


@dataclass(slots=True)
class Notice(Event):
    """Anything else worth a line in the timeline."""

    message: str
    level: str = "info"
    extra: dict[str, str] = field(default_factory=dict)


def describe(event: Event) -> str | None:
    """The line a person reads for this event; None for events too frequent to list."""
    match event:  # the step events first: a big site makes thousands of them
        case StepStarted(step=step, action=action):
            return f"  start {step} ({action})"
        case StepFinished(step=step, state=state, detail=detail):
            return f"  {state:<9} {step}: {detail}"
        case PhaseChanged(old=old, new=new, reason=reason):
            return f"phase {old} -> {new}: {reason}"
        case RunStarted(run=run, direction=direction, steps=steps, reason=reason):
            return f"{direction} runbook started ({steps} steps): {reason}  [{run}]"
        case RunFinished(direction=direction, state=state, detail=detail):
            return f"{direction} runbook {state}: {detail}"
        case StepWaiting(step=step, reason=reason):
            return f"  waiting  {step}: {reason}"
        case PointOfNoReturn(step=step):
            return f"point of no return: {step} starts"
        case CacheModeChanged(cache=cache, target=target, mode=mode, ok=ok, detail=detail):
            verdict = "" if ok else f" FAILED: {detail}"
            return f"cache {cache}/{target} -> {mode}{verdict}"
        case CacheClean(cache=cache, waited_s=waited):
            return f"cache {cache} clean (waited {waited:.0f} s)"
        case RiskAccepted(what=what):
            return f"RISK: {what}"
        case Notice(message=message, level=level):
            return message if level == "info" else f"{level.upper()}: {message}"
    return None


EventSink = Callable[[Event], None]


class EventBus:
    """Fans one event out to every subscriber, in subscription order."""

    def __init__(self) -> None:
        self._sinks: list[EventSink] = []

    def subscribe(self, sink: EventSink) -> None:
        self._sinks.append(sink)

    def __call__(self, event: Event) -> None:
        for sink in self._sinks:
            sink(event)
