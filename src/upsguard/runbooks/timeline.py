"""One line of text for each event: the simulator's timeline and the service's log read alike."""

from __future__ import annotations

from upsguard.events import (
    CacheClean,
    CacheModeChanged,
    Event,
    Notice,
    PhaseChanged,
    PointOfNoReturn,
    RiskAccepted,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
    StepWaiting,
)


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
