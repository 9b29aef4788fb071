"""Start-up: reap what a dead controller left, restore its phase and hold, finish its run.

Runs before any policy is evaluated. Steps the journal shows ``running`` are marked
``abandoned``; older unfinished runs are closed as superseded; the run ledger is
restored from the journal; then the newest unfinished run (interrupted by a stop, or
left running by a crash) is started again under its own id with the steps already done
(or skipped) left out, so they are not run again. Every other step first reads its
target's real state (a VM already off is done), and on a platform that lists its tasks
waits for its request still under way (a host shutting down still reads on), so a step
that was cut short is finished, not repeated.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from upsguard.clock import Clock
from upsguard.engine.actions import UnderWay
from upsguard.engine.outage_controller import OutageController
from upsguard.engine.pair import SharedRun
from upsguard.events import EventSink, Notice
from upsguard.journal.rows import RequestRow, RunRow, parse_iso
from upsguard.journal.store import Journal
from upsguard.models import (
    CacheMode,
    CacheName,
    CommandProcess,
    Phase,
    PlatformName,
    PowerState,
    ResourceKind,
    RunId,
    StepId,
    Target,
    UpsName,
)
from upsguard.runs import RunKind, RunOutcome

log = logging.getLogger(__name__)

FLIPPED_PHASES = (Phase.ON_BATTERY, Phase.SHEDDING, Phase.SHUTTING_DOWN)


async def reap_and_resume(
    journal: Journal,
    controller: OutageController,
    clock: Clock,
    events: EventSink,
    resume: bool = True,
) -> str | None:
    """Returns the id of the run resumed, if any. ``resume``: False for a controller of a
    pair, which resumes the run the shared ledger holds once it wins the lease, never the
    one its own journal left (the other controller may have finished it since)."""
    unfinished = journal.write.reap(clock.now())
    newest, older = (unfinished[0], unfinished[1:]) if unfinished else (None, [])
    for run in older:
        journal.write.close_run(
            run.id, clock.now(), RunOutcome.ABANDONED, f"superseded by {newest and newest.id}"
        )
    if not resume and newest is not None:
        controller.left_in_journal(_journaled(journal, newest))
        newest = None
    if newest is not None and _only_own_machine_left(controller, _journaled(journal, newest)):
        journal.write.close_run(newest.id, clock.now(), RunOutcome.DONE, OWN_POWEROFF)
        events(Notice(clock.now(), f"run {newest.id}: {OWN_POWEROFF}"))
        newest = None
    controller.ledger.restore(journal.read.records())
    phase = journal.read.last_phase()
    if phase is not None:
        back = journal.read.mains_back_since()
        online_for = (clock.now() - back).total_seconds() if back is not None else None
        controller.engine.restore(phase, online_for)
    held = journal.read.hold()
    if held is not None:
        controller.engine.hold(held.reason)
    controller.caches.owe(CacheName(c) for c in journal.read.owed_caches())
    controller.asked_before(_asked_before(journal, clock.now()))
    if controller.engine.phase in FLIPPED_PHASES and controller.may_act:
        # the standby of a pair never acts: the phase journaled may be long over, and the
        # leader keeps the caches (a flip made here would be a debt no one holds)
        await _caches_write_through(controller, clock, events)
    if newest is None:
        return None
    return await _resume(journal, controller, newest, clock, events)


OWN_POWEROFF = (
    "finished by the controller's own poweroff (every other step was done; the machine "
    "running upsguard went down last, as planned)"
)


def _only_own_machine_left(controller: OutageController, run: SharedRun) -> bool:
    """A whole-site shutdown whose only unfinished steps stop the machine running upsguard,
    and had started: this process starting means that machine went down and came back.
    Stopping it again would power it off after every boot. Steps that never started did
    not stop it: the service itself was restarted (a kill, an upgrade) before they could,
    and the run goes on (the UPSes told, the machine stopped last)."""
    if run.spec.kind is not RunKind.SHUTDOWN or run.spec.only is not None:
        return False
    left = [s for s in controller.shutdown_plan.steps if s.id not in run.done]
    return bool(left) and all(
        s.settings is not None and s.settings.resource.runs_upsguard and s.id in run.unsure
        for s in left
    )


def _journaled(journal: Journal, run: RunRow) -> SharedRun:
    """The run as this controller's journal left it, read once: the steps it finished (done
    or skipped) and how, those it started and did not finish, and the UPSes it told."""
    latest = {StepId(s.step): s.state for s in journal.read.steps(run.id)}
    done = {s: state for s, state in latest.items() if state.finished}
    unsure = tuple(sorted(latest.keys() - done.keys()))
    told = {UpsName(u): at for u, at in journal.read.upses_told(run.id).items()}
    return SharedRun(run.record().spec, done, (), unsure, told=told)


async def _resume(
    journal: Journal, controller: OutageController, run: RunRow, clock: Clock, events: EventSink
) -> str:
    left = _journaled(journal, run)
    message = f"resuming {run.kind} run {run.id}: {len(left.done)} step(s) already done" + (
        f"; checking the real state of {', '.join(left.unsure)}" if left.unsure else ""
    )
    if left.told:
        message += f"; UPS {', '.join(sorted(left.told))} told already (not told again)"
    log.warning(message)
    events(Notice(clock.now(), message, level="warning"))
    return await controller.resume(left.spec, left.done, left.told)


REQUESTS_LAND_WITHIN = timedelta(hours=1)
"""A request older than this has landed or never will: it is not waited for again."""


def _asked_before(journal: Journal, now: datetime) -> list[UnderWay]:
    """The requests platforms accepted before the restart that may still be landing: the
    steps that find one wait for it (see ``engine.actions``)."""
    out = []
    for row in journal.read.pending_requests(now - REQUESTS_LAND_WITHIN):
        target = Target(PlatformName(row.platform), ResourceKind(row.target_kind), row.target)
        request = UnderWay(
            RunId(row.run),
            StepId(row.step),
            target,
            PowerState(row.wanted),
            before_restart=True,
            process=_process(row),
            at=parse_iso(row.at),
        )
        out.append(request)
    return out


def _process(row: RequestRow) -> CommandProcess | None:
    """The command process a request started, when it is one (see ``CommandProcess``)."""
    if row.pid is None or row.pid_start is None or row.exit_file is None:
        return None
    session = row.session if row.session is not None else row.pid
    return CommandProcess(row.pid, row.pid_start, session, row.exit_file, parse_iso(row.at))


async def _caches_write_through(
    controller: OutageController, clock: Clock, events: EventSink
) -> None:
    """The site was on battery: any cache found back in write-back is flipped again."""
    caches = controller.caches
    if not caches.names:
        return
    statuses = await caches.poll()
    wrong: set[CacheName] = {
        s.cache for s in statuses if s.state is not None and s.state.mode is CacheMode.WRITE_BACK
    }
    if wrong:
        events(Notice(clock.now(), f"caches in write-back after a restart: {sorted(wrong)}"))
        await caches.set_mode(CacheMode.WRITE_THROUGH, sorted(wrong))
