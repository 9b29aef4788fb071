"""Start-up: reap what a dead controller left, restore its phase and hold, finish its run.

Runs before any policy is evaluated. Steps the journal shows ``running`` are
marked ``abandoned``; the newest unfinished run is started again under its own
id with the steps already done (or skipped) left out, so they are not run
again; every other step first reads its target's real state (a VM already off
is done), so a step that was cut short is finished, not repeated. Older
unfinished runs are closed as superseded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from upsguard.clock import Clock
from upsguard.controller.journal import Journal
from upsguard.controller.rows import RunRow, parse_iso
from upsguard.engine.outage_controller import OutageLoop, RunSpec
from upsguard.events import EventSink, Notice
from upsguard.models import CacheMode, CacheName, Phase, ResourceId, StepId
from upsguard.policies.phases import RunState
from upsguard.runbooks.plan import Direction

log = logging.getLogger(__name__)

FINISHED_OK = ("done", "skipped")
FLIPPED_PHASES = (Phase.ON_BATTERY, Phase.SHEDDING, Phase.SHUTTING_DOWN)


async def reap_and_resume(
    journal: Journal, loop: OutageLoop, clock: Clock, events: EventSink
) -> str | None:
    """Returns the id of the run resumed, if any."""
    unfinished = journal.reap(clock.now())
    phase = journal.last_phase()
    if phase is not None:
        loop.engine.restore(phase)
    held = journal.hold()
    if held is not None:
        loop.engine.hold(held.reason)
    loop.runs = restore_runs(journal.runs(limit=20, with_steps=False))
    if loop.engine.phase in FLIPPED_PHASES:
        await _caches_write_through(loop, clock, events)
    if not unfinished:
        return None
    newest, older = unfinished[0], unfinished[1:]
    for run in older:
        journal.close_run(run.id, clock.now(), "abandoned", f"superseded by {newest.id}")
    return await _resume(journal, loop, newest, clock, events)


def restore_runs(runs: Iterable[RunRow]) -> RunState:
    """What the phase engine needs to know about runs, from the journal's newest first."""
    state = RunState()
    for run in runs:
        if run.only is not None and run.kind != "shedding":
            continue  # a partial manual run says nothing about the site as a whole
        if run.kind == "startup":
            state.startup_finished = run.state == "done"
            state.startup_failed = run.state == "failed"
            state.something_stopped = run.state != "done"
            return state
        state.something_stopped = True
        if run.kind == "shutdown":
            state.shutdown_finished = run.state in ("done", "failed")
            state.shutdown_manual = run.origin == "manual"
            state.point_of_no_return = run.point_of_no_return is not None
            state.cancelled_before_ponr = run.state == "cancelled" and not state.point_of_no_return
            return state
        state.shedding_started = True
    return state


async def _resume(
    journal: Journal, loop: OutageLoop, run: RunRow, clock: Clock, events: EventSink
) -> str:
    steps = journal.steps(run.id)
    latest = {s.step: s.state for s in steps}
    done = {StepId(s) for s, state in latest.items() if state in FINISHED_OK}
    abandoned = sorted(s for s, state in latest.items() if state == "abandoned")
    spec = RunSpec(
        run=run.id,
        at=parse_iso(run.started),
        direction=Direction(run.direction),
        kind=run.kind,
        origin=run.origin,
        reason=run.reason,
        only=tuple(ResourceId(r) for r in run.only) if run.only is not None else None,
    )
    message = f"resuming {run.kind} run {run.id}: {len(done)} step(s) already done" + (
        f"; checking the real state of {', '.join(abandoned)}" if abandoned else ""
    )
    log.warning(message)
    events(Notice(clock.now(), message, level="warning"))
    ponr = StepId(run.point_of_no_return) if run.point_of_no_return else None
    return await loop.resume(spec, done, ponr)


async def _caches_write_through(loop: OutageLoop, clock: Clock, events: EventSink) -> None:
    """The site was on battery: any cache found back in write-back is flipped again."""
    if not loop.caches.names:
        return
    statuses = await loop.caches.poll()
    wrong: set[CacheName] = {
        s.cache for s in statuses if s.state is not None and s.state.mode is CacheMode.WRITE_BACK
    }
    if wrong:
        events(Notice(clock.now(), f"caches in write-back after a restart: {sorted(wrong)}"))
        await loop.caches.set_mode(CacheMode.WRITE_THROUGH, sorted(wrong))
