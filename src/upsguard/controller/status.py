"""The one builder of ``upsguard.status.SiteStatus``: from the running service, or from the
journal and one fresh poll of each UPS when no service runs.

Both ways go through the same functions (UPSes from their watches, feeds from
``policies.power``, the hold and the last run from the journal), so ``status`` reads the
same whichever way it was made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from upsguard.config.site import SiteConfig
from upsguard.decisions import NO_PLAN, PlanTime
from upsguard.engine.outage_controller import OutageController
from upsguard.engine.pair import Pair
from upsguard.journal import Journal
from upsguard.journal.rows import OverrideRow, StepRow, parse_iso
from upsguard.models import Direction, LinkState, Phase, StepId, StepState, UpsName
from upsguard.plugins.coordination.base import UpsSeen
from upsguard.policies.outlook import fires_in
from upsguard.policies.phases import condition_inputs
from upsguard.policies.power import FeedReading, feed_name, read_feeds
from upsguard.policies.reckoning import reckon
from upsguard.policies.watch import UpsWatch
from upsguard.runbooks.plan import Plan
from upsguard.status import (
    Alert,
    CacheStatus,
    Countdown,
    FeedStatus,
    Hold,
    LastRun,
    PairStatus,
    PeerUps,
    PeerView,
    PlanStatus,
    RunningStep,
    RunStatus,
    ServiceState,
    SiteStatus,
    StepProgress,
    StepStatus,
    Trigger,
    UpsStatus,
)


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
    now: datetime | None = None,
    pair: PairStatus | None = None,
) -> SiteStatus:
    now = now or datetime.now(UTC)
    held = _hold(journal.read.hold()) if controller.held else None
    if held is None and controller.held:
        held = Hold(reason=controller.held)
    run = run_status(controller, journal, now)
    upses = ups_status(controller.watches)
    plan_s = controller.plan_seconds() if controller.view is not None else {}
    view = controller.read_view()  # the same readings as the UPS lines above
    return SiteStatus(
        site=site.site,
        at=now,
        service=ServiceState(
            running=True,
            journal=str(journal.path),
            pid=info.pid,
            since=info.since,
            poll_interval_s=info.poll_interval_s,
            polls=info.polls,
            resumed=info.resumed,
        ),
        phase=controller.phase,
        phase_since=_phase_since(journal),
        held=held,
        at_floor=controller.at_floor,
        ups=upses,
        feeds=feeds_status(site, view.feeds, plan_s, upses),
        countdown=countdown(site, controller, run, plan_s),
        run=run,
        last_run=_last_run(journal),
        unfinished_runs=[],
        caches=caches_status(controller),
        alerts=[Alert(text=text) for text in [*alerts, *controller.alerts()]],
        ha=pair,
    )


def pair_status(pair: Pair, monotonic: float) -> PairStatus:
    """The pair as this controller sees it: its role and term, and the shared ledger as
    last read (the standby's view of the leader's run)."""
    state = pair.state()
    seen = pair.seen
    active = seen.active if seen is not None else None
    done = None
    if seen is not None and active is not None:
        done = sum(1 for m in seen.steps_of(active.spec.id).values() if m.state.finished)
    notice = seen.alone if seen is not None else None
    own = pair.leadership.alone_reason
    if own is not None:
        alone: str | None = f"{state.me}: {own}"
    else:
        alone = f"{notice.by}: {notice.reason}" if notice is not None else None
    return PairStatus(
        me=state.me,
        role=state.role.value,
        leader=state.leader,
        token=state.token,
        lease_age_s=state.lease_age_s,
        lease_ttl_s=state.ttl_s,
        store_silent_s=state.store_silent_s,
        detail=state.detail,
        shared_run=active.spec.id if active is not None else None,
        shared_steps_done=done,
        seen_age_s=monotonic - pair.seen_at if pair.seen_at is not None else None,
        alone=alone,
        others=[
            PeerView(
                name=view.by,
                role=view.role,
                at=view.at,
                ups=[
                    PeerUps(
                        name=u.ups,
                        word=u.word,
                        charge_pct=u.charge_pct,
                        runtime_s=u.runtime_s,
                        why=u.why,
                    )
                    for u in view.ups
                ],
            )
            for view in pair.others
        ],
        others_age_s=monotonic - pair.others_at if pair.others_at is not None else None,
    )


def ups_seen(watches: Mapping[UpsName, UpsWatch]) -> list[UpsSeen]:
    """Each UPS as this controller reads it, for the other controller of the pair to show."""
    seen = []
    for name, watch in watches.items():
        last = watch.last
        if last is None:
            seen.append(UpsSeen(name, "unread", why=watch.last_error or "not read yet"))
            continue
        word = watch.figures().word
        live = last.link is LinkState.OK
        why = "" if live else (watch.last_error or f"link {last.link.value}")
        seen.append(UpsSeen(name, word, last.charge_pct, watch.runtime_s(), why))
    return seen


def offline_status(
    site: SiteConfig,
    journal: Journal,
    watches: Mapping[UpsName, UpsWatch],
    now: datetime | None = None,
) -> SiteStatus:
    """What the journal says when no service is running, with one fresh poll of each UPS
    (``watches``, polled by the caller; a UPS that could not be read is shown as such)."""
    now = now or datetime.now(UTC)
    last_phase = journal.read.last_phase()
    polled = {name: w.figures() for name, w in watches.items() if w.last is not None}
    feeds = read_feeds(site.effective_feeds(), polled, site.policies.on_lost_contact_while_on_line)
    upses = [_or_journaled(u, journal, now) for u in ups_status(watches)]
    return SiteStatus(
        site=site.site,
        at=now,
        service=ServiceState(running=False, journal=str(journal.path)),
        phase=last_phase or Phase.NORMAL,
        phase_since=_phase_since(journal),
        held=_hold(journal.read.hold()),
        ups=upses,
        feeds=feeds_status(site, feeds, {}, upses),
        last_run=_last_run(journal),
        unfinished_runs=[
            r.id for r in journal.read.runs(limit=20, with_steps=False) if r.unfinished
        ],
        caches=_journaled_caches(journal),
    )


def _or_journaled(ups: UpsStatus, journal: Journal, now: datetime) -> UpsStatus:
    """A UPS that cannot be read now is shown with its last journaled values, as lost."""
    if ups.link is LinkState.OK:
        return ups
    rows = journal.read.readings(limit=1, ups=ups.name)
    if not rows:
        return ups
    row = rows[0]
    at = parse_iso(row.at)
    return UpsStatus(
        name=ups.name,
        polled=True,
        status=row.status,
        on_battery="OB" in row.status.split(),
        charge_pct=row.charge,
        runtime_s=row.runtime,
        reported_runtime_s=row.runtime,
        load_pct=row.load,
        input_voltage=row.input_voltage,
        link=LinkState.LOST,
        age_s=max(0.0, (now - at).total_seconds()),
        at=at,
        error=ups.error,
    )


def _hold(row: OverrideRow | None) -> Hold | None:
    if row is None:
        return None
    return Hold(reason=row.reason, who=row.who, at=parse_iso(row.at))


def _phase_since(journal: Journal) -> datetime | None:
    phases = journal.read.phases(limit=1)
    return parse_iso(phases[0].at) if phases else None


def _last_run(journal: Journal) -> LastRun | None:
    runs = journal.read.runs(limit=1, with_steps=False)
    if not runs:
        return None
    r = runs[0]
    return LastRun(
        id=r.id,
        kind=r.kind,
        state=r.state,
        started=parse_iso(r.started),
        ended=parse_iso(r.ended) if r.ended else None,
        detail=r.detail,
    )


def ups_status(watches: Mapping[UpsName, UpsWatch]) -> list[UpsStatus]:
    out = []
    for name, watch in watches.items():
        last = watch.last
        if last is None:
            out.append(UpsStatus(name=name, polled=False, error=watch.last_error))
            continue
        out.append(
            UpsStatus(
                name=name,
                polled=True,
                status=" ".join(sorted(f.value for f in last.flags)),
                on_battery=last.on_battery,
                charge_pct=last.charge_pct,
                runtime_s=watch.runtime_s(),
                reported_runtime_s=last.runtime_s,
                depletion_pct_per_min=watch.depletion_pct_per_min,
                load_pct=last.load_pct,
                input_voltage=last.input_voltage,
                link=last.link,
                age_s=last.age_s if last.age_s != float("inf") else None,
                at=last.at,
                error=watch.last_error,
            )
        )
    return out


def feeds_status(
    site: SiteConfig,
    feeds: Sequence[FeedReading],
    plan_s: Mapping[str, PlanTime],
    upses: Sequence[UpsStatus] = (),
) -> list[FeedStatus]:
    """Each feed as read; one whose members cannot be read says which and why (``upses``:
    their status, with each one's error)."""
    configs = {feed_name(c, i): c for i, c in enumerate(site.effective_feeds())}
    errors = {u.name: u.error for u in upses}
    out = []
    for f in feeds:  # before the first poll, every member reads unknown
        members = dict(zip((str(u) for u in configs[f.name].ups), f.members, strict=True))
        out.append(
            FeedStatus(
                name=f.name,
                state=f.state,
                at_risk=f.at_risk,
                online=f.online,
                needed=f.needed,
                members=members,
                runtime_s=f.runtime_s,
                charge_pct=f.charge_pct,
                depletion_pct_per_min=f.depletion_pct_per_min,
                low_battery=f.low_battery,
                lost=f.lost,
                at_risk_for_s=f.at_risk_for_s,
                plan_s=plan_s[f.name].total_s if f.name in plan_s else None,
                unknown=f.unknown,
                why=_unread(members, errors) if f.unknown else None,
            )
        )
    return out


def _unread(members: Mapping[str, str], errors: Mapping[str, str | None]) -> str:
    """``cp1500 cannot be read: <its error>`` for each member whose word is unknown."""
    return "; ".join(
        f"{name} cannot be read: {errors.get(name) or 'no reading yet'}"
        for name, word in members.items()
        if word == "unknown"
    )


def countdown(
    site: SiteConfig,
    controller: OutageController,
    run: RunStatus | None,
    plan_s: Mapping[str, PlanTime],
) -> Countdown | None:
    """Runtime left against what the shutdown still needs, and when each trigger fires."""
    view = controller.view
    if view is None:
        return None
    at_risk = view.at_risk
    if run is not None and run.direction is Direction.SHUTDOWN:
        plan_left: float | None = run.left_s
    elif at_risk:
        plan_left = max(plan_s.get(f.name, NO_PLAN).total_s for f in at_risk)
    else:
        plan_left = controller.shutdown_plan.estimate_s + controller.caches.eta_s()
    runtime = view.runtime_s()
    margin = site.policies.required_margin.total_seconds()
    spare = None if runtime is None or plan_left is None else runtime - plan_left - margin
    return Countdown(
        on_battery=view.on_battery,
        runtime_left_s=runtime,
        plan_left_s=plan_left,
        margin_s=margin,
        spare_s=spare,
        triggers=[t for f in at_risk for t in triggers(site, f, plan_s.get(f.name, NO_PLAN))],
    )


def triggers(site: SiteConfig, feed: FeedReading, plan: PlanTime) -> list[Trigger]:
    """Each shutdown condition for one feed at risk: whether it holds, with its figures,
    and when it will at the present drain (runtime falls a second a second; charge at the
    measured rate)."""
    values, flags = condition_inputs(feed)
    out = []
    for condition in site.policies.shutdown.when_any:
        judged = reckon(condition, feed.name, values, flags, plan)
        out.append(
            Trigger(
                condition=condition.text,
                feed=feed.name,
                holds=judged.holds,
                fires_in_s=fires_in(condition, judged, values),
                figures=judged.figures(),
            )
        )
    return out


def run_status(controller: OutageController, journal: Journal, now: datetime) -> RunStatus | None:
    progress = controller.progress()
    executor = controller.executor
    if progress is None or executor is None:
        return None
    spec = progress.spec
    by_id = executor.plan.by_id()
    rows = {row.step: row for row in journal.read.steps(spec.id)}  # the last attempt wins
    plan = plan_status(executor.plan, rows, set(progress.running), now)
    since = {
        request.step: request.at
        for request in executor.under_way.values()
        if request.before_restart and request.at is not None
    }
    return RunStatus(
        id=spec.id,
        kind=spec.kind,
        direction=spec.direction,
        origin=spec.origin,
        reason=spec.reason,
        started=spec.at,
        elapsed_s=max(0.0, (now - spec.at).total_seconds()),
        total=progress.total,
        finished=len(progress.finished),
        failed=sorted(s for s, state in progress.finished.items() if state is StepState.FAILED),
        running=[
            RunningStep(
                step=s, description=by_id[s].description, under_way_since=since.get(StepId(s))
            )
            for s in progress.running
            if s in by_id
        ],
        point_of_no_return=progress.point_of_no_return,
        left_s=_left_s(plan),
        plan=plan,
    )


def plan_status(
    plan: Plan,
    rows: Mapping[str, StepRow] | None = None,
    running: set[str] | None = None,
    now: datetime | None = None,
) -> PlanStatus:
    """A plan with each step's state, from the journal's rows of its run (none: all waiting)."""
    in_run = rows is not None
    rows = rows or {}
    running = running or set()
    now = now or datetime.now(UTC)
    critical = set(plan.critical_path)
    finished = {sid for sid, row in rows.items() if row.state is not StepState.RUNNING}
    steps = []
    for step in plan.steps:
        row = rows.get(step.id)
        state = _progress(row, step.id in running)
        if in_run and state is StepProgress.WAITING and step.caches:
            state = StepProgress.GATED if set(step.waits_for) <= finished else state
        started = parse_iso(row.started) if row else None
        ended = parse_iso(row.ended) if row and row.ended else None
        elapsed = None if started is None else ((ended or now) - started).total_seconds()
        steps.append(
            StepStatus(
                id=step.id,
                resource=step.resource,
                kind=step.kind.value,
                action=step.action.value,
                description=step.description,
                waits_for=list(step.waits_for),
                state=state,
                estimate_s=step.estimate_s,
                started=started,
                ended=ended,
                elapsed_s=None if elapsed is None else max(0.0, elapsed),
                detail=row.detail if row else "",
                critical=step.id in critical,
                point_of_no_return=plan.direction is Direction.SHUTDOWN
                and step.is_point_of_no_return,
                caches=list(step.caches),
            )
        )
    return PlanStatus(
        direction=plan.direction,
        estimate_s=plan.estimate_s,
        critical_path=list(plan.critical_path),
        critical_path_s=plan.critical_path_s,
        steps=steps,
    )


def _progress(row: StepRow | None, running: bool) -> StepProgress:
    if running:
        return StepProgress.RUNNING
    if row is None or row.state is StepState.RUNNING:
        return StepProgress.WAITING  # a barrier, or a step whose start is not journaled yet
    if row.state is StepState.DONE and row.fallback_used:
        return StepProgress.FELL_BACK
    return StepProgress(row.state.value)


def _left_s(plan: PlanStatus) -> float:
    """The longest chain of what is left: a running step's rest of its estimate, a waiting
    step's whole estimate, a finished step nothing (plan steps come in a valid order)."""
    finish: dict[str, float] = {}
    for step in plan.steps:
        if step.state in (StepProgress.WAITING, StepProgress.GATED):
            own = step.estimate_s
        elif step.state is StepProgress.RUNNING:
            own = max(0.0, step.estimate_s - (step.elapsed_s or 0.0))
        else:
            own = 0.0
        finish[step.id] = own + max((finish[w] for w in step.waits_for), default=0.0)
    return max(finish.values(), default=0.0)


def caches_status(controller: OutageController) -> list[CacheStatus]:
    gates: dict[str, list[str]] = {}
    for step in controller.shutdown_plan.steps:
        for cache in step.caches:
            gates.setdefault(cache, []).append(step.id)
    return [
        CacheStatus(
            cache=s.cache,
            target=s.target.name,
            mode=s.state.mode.value if s.state else None,
            dirty_bytes=s.state.dirty_bytes if s.state else None,
            clean=s.clean if s.state else None,
            rate_bps=s.rate_bps,
            eta_s=s.eta_s,
            error=s.error,
            gates=gates.get(s.cache, []),
        )
        for s in controller.caches.status.values()
    ]


def _journaled_caches(journal: Journal) -> list[CacheStatus]:
    """Without a service: each cache target's mode as last set, from the journal."""
    last: dict[tuple[str, str], CacheStatus] = {}
    for op in journal.read.cache_ops(limit=200):  # newest first
        key = (op.cache, op.target)
        if key not in last:
            last[key] = CacheStatus(
                cache=op.cache,
                target=op.target,
                mode=op.mode if op.ok else None,
                error=None if op.ok else op.detail,
            )
    return sorted(last.values(), key=lambda c: (c.cache, c.target))
