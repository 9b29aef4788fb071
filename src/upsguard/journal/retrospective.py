"""A retrospective's story from the journal: an outage and its runs, each beside its plan.

The plan a run is compared with is the one its planner made: the site file plus the
durations learned from the runs before it. The story starts with the outage around its runs
(``outages``): at the mains failure when there was one, else at the first phase change, or
at the run that moved no phase. Its times are the journal's own (UTC).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from upsguard.config.site import SiteConfig
from upsguard.errors import PermanentError
from upsguard.events import (
    RISK_PREFIX,
    CacheClean,
    OnBattery,
    PointOfNoReturn,
    PowerRestored,
    RiskAccepted,
    UpsCommandSent,
)
from upsguard.journal.as_before import found_off
from upsguard.journal.learned import learned_durations
from upsguard.journal.outages import Outage, outage_of, outages
from upsguard.journal.rows import EventRow, RunRow, StepRow, iso, parse_iso
from upsguard.journal.store import Journal
from upsguard.models import Direction, LinkState, Phase, RunId
from upsguard.reports.assemble import outlook, plan_for, run_story
from upsguard.reports.story import (
    BatterySample,
    CacheSample,
    Moment,
    RunFacts,
    RunStory,
    StepRecord,
    Story,
    UpsCommand,
)
from upsguard.reports.way_back import way_back
from upsguard.runbooks.plan import Durations
from upsguard.runbooks.planner import Planner

MARGIN = timedelta(minutes=1)
"""Readings and events this long before and after the story still belong to it."""


def pick_runs(journal: Journal, run_id: str | None) -> list[RunRow]:
    """The run asked for, or the newest; a one-line error when there is none."""
    if run_id is not None:
        run = journal.read.run(run_id)
        if run is None:
            raise PermanentError(
                f"journal {journal.path}: no run '{run_id}': 'upsguard history' lists the runs"
            )
        return [run]
    newest = journal.read.runs(limit=1)
    if not newest:
        raise PermanentError(f"journal {journal.path}: no run yet, nothing to report")
    return newest


def story_from_journal(
    journal: Journal,
    site: SiteConfig,
    runs: Sequence[RunRow],
    title: str,
    source: str,
    *,
    outage: Outage | None = None,
    planned_with: Durations | None = None,
    learned: Durations | None = None,
    origin: datetime | None = None,
) -> Story:
    """The story of ``runs``, from the start of the outage around them (``outage``, by
    default the first run's) to their end, or to the outage's end when ``outage`` is given
    (no run and no outage: the whole journal, as a dry run that needed no shutdown leaves
    it).

    Each run is compared with the plan its planner made: by default with the durations the
    journal had learned before it; ``planned_with`` when the runs were planned otherwise (a
    dry run). The outlook uses ``learned``, by default everything this journal learned.
    ``origin``: the story's T+0 when it is not the outage's start (a dry run counts from the
    start of its scenario, as its timeline and verdict do)."""
    runs = sorted(runs, key=lambda r: r.started)
    ends = [_run_end(r) for r in runs]
    if outage is not None:
        ends += [outage.ended or _last_event(journal)]
    elif runs:
        outage = outage_of(journal, runs[0].id)
    if outage is not None:
        start, end = outage.origin, max(ends)
    elif runs:
        start, end = parse_iso(runs[0].started), max(ends)
    else:
        start, end = _journal_span(journal)
        found = outages(journal)
        if found:  # the whole journal: from its first mains failure to its last return
            outage = replace(found[0], mains_back=found[-1].mains_back)
            start = outage.mains_failed or start
    origin = origin or start
    window = (iso(origin - MARGIN), iso(end + MARGIN))
    events = journal.read.events_between(*window)
    if learned is None:
        learned = learned_durations(journal)
    stories: list[RunStory] = []
    outlooks = []
    for run in runs:
        facts = _facts(run)
        used = planned_with
        if used is None:
            used = learned_durations(journal, before=facts.started)
        planner = Planner(site, durations=used)
        plan = plan_for(planner, facts)
        story = run_story(facts, [_record(s) for s in run.steps], plan, origin)
        if facts.direction is Direction.STARTUP:
            before = found_off(journal, RunId(run.id), started_by=run.started)
            story = replace(story, way_back=way_back(story.steps, before))
        stories.append(story)
        outlooks.append(outlook(site, facts, plan, learned, story.duration_s))
    commands = _ups_commands(events, origin)
    return Story(
        title=title,
        site=site.site,
        source=source,
        origin=origin,
        runs=tuple(stories),
        moments=tuple(_moments(journal, events, origin, window, stories, commands)),
        battery=tuple(_battery(journal, origin, window)),
        caches=tuple(_caches(journal, events, origin, window)),
        ups_commands=tuple(commands),
        outlook=tuple(outlooks),
        mains_failed=outage.mains_failed if outage is not None else None,
        mains_back=outage.mains_back if outage is not None else None,
    )


def _last_event(journal: Journal) -> datetime:
    """Where an outage that goes on ends for now: at the journal's last event."""
    last = journal.read.events(after=-1)
    if not last:
        raise PermanentError(f"journal {journal.path}: nothing recorded yet, nothing to report")
    return parse_iso(last[-1].at)


def _journal_span(journal: Journal) -> tuple[datetime, datetime]:
    """From the first phase change away from normal (else the first event) to the last event."""
    phases = list(reversed(journal.read.phases(limit=1000)))
    events = journal.read.events(after=0, limit=1) + journal.read.events(after=-1)
    if not events:
        raise PermanentError(f"journal {journal.path}: nothing recorded yet, nothing to report")
    start = next((p.at for p in phases if p.new is not Phase.NORMAL), events[0].at)
    return parse_iso(start), parse_iso(events[-1].at)


def _run_end(run: RunRow) -> datetime:
    ends = [parse_iso(s.ended) for s in run.steps if s.ended]
    if run.ended:
        ends.append(parse_iso(run.ended))
    return max(ends, default=parse_iso(run.started))


def _facts(run: RunRow) -> RunFacts:
    return RunFacts(
        id=run.id,
        kind=run.kind,
        direction=run.direction,
        origin=run.origin,
        reason=run.reason,
        started=parse_iso(run.started),
        ended=parse_iso(run.ended) if run.ended else None,
        state=run.state,
        detail=run.detail,
        only=run.only,
        point_of_no_return=run.point_of_no_return,
    )


def _record(row: StepRow) -> StepRecord:
    return StepRecord(
        step=row.step,
        action=row.action,
        started=parse_iso(row.started) if row.ran else None,
        ended=parse_iso(row.ended) if row.ended else None,
        state=row.state,
        detail=row.detail,
        tries=row.tries,
        fallback_used=row.fallback_used,
        resource=row.resource,
    )


def _seconds(at: str, origin: datetime) -> float:
    return (parse_iso(at) - origin).total_seconds()


def _moments(
    journal: Journal,
    events: list[EventRow],
    origin: datetime,
    window: tuple[str, str],
    runs: list[RunStory],
    commands: list[UpsCommand],
) -> list[Moment]:
    start, end = window
    out = [
        Moment(_seconds(p.at, origin), "phase", f"{p.old} -> {p.new}", why=p.reason)
        for p in reversed(journal.read.phases(limit=1000))  # oldest first, as journaled
        if start <= p.at <= end
    ]
    out += [
        Moment(_seconds(o.at, origin), "override", o.action, who=o.who, why=o.reason)
        for o in reversed(journal.read.overrides(limit=1000))
        if start <= o.at <= end
    ]
    for event in events:
        if event.kind == RiskAccepted.__name__:
            out.append(
                Moment(_seconds(event.at, origin), "risk", event.text.removeprefix(RISK_PREFIX))
            )
        elif event.kind == PointOfNoReturn.__name__:
            out.append(Moment(_seconds(event.at, origin), "trigger", event.text))
        elif event.kind in _MAINS:
            out.append(Moment(_seconds(event.at, origin), _MAINS[event.kind], event.text))
    for run in runs:
        facts = run.facts
        text = f"{facts.kind} run {facts.id} starts ({facts.origin}): {facts.reason}"
        out.append(Moment(run.start_s, "trigger", text))
        if facts.ended is not None:
            outcome = facts.state.value + (f": {facts.detail}" if facts.detail else "")
            ended = (facts.ended - origin).total_seconds()
            out.append(Moment(ended, "run", f"{facts.kind} run {facts.id} ends {outcome}"))
    for c in commands:
        if c.ok:
            out.append(Moment(c.at_s, "command", f"UPS {c.ups}: {c.command} sent"))
        else:
            out.append(Moment(c.at_s, "command_failed", f"UPS {c.ups}: {c.command}: {c.detail}"))
    out.sort(key=lambda m: m.at_s)  # stable: what happened at one instant stays in order
    return out


_MAINS = {OnBattery.__name__: "mains_failed", PowerRestored.__name__: "mains_back"}
"""The moment each feed event is: a person reads them as the mains failing and returning."""


def _battery(journal: Journal, origin: datetime, window: tuple[str, str]) -> list[BatterySample]:
    return [
        BatterySample(
            ups=r.ups,
            at_s=_seconds(r.at, origin),
            charge_pct=r.charge,
            runtime_s=r.runtime,
            load_pct=r.load,
            on_battery="OB" in r.status.split(),
        )
        for r in journal.read.readings_between(*window)
        if r.link is LinkState.OK
    ]


def _caches(
    journal: Journal, events: list[EventRow], origin: datetime, window: tuple[str, str]
) -> list[CacheSample]:
    """What the journal knows of each cache: its flips, when it was clean, risks taken with
    it dirty. The journal keeps no dirty-byte figures: a flip's bytes are unknown (None).

    Which cache a clean or a risk concerns is read from the event's payload. Events
    journaled before payloads were kept (schema 4 and older) have none: their clean and
    risk moments are left out of the cache timeline (the risk still shows among the
    moments), rather than guessed from the words of their line."""
    start, end = window
    out = [
        CacheSample(
            op.cache,
            _seconds(op.at, origin),
            None,
            f"{op.target} -> {op.mode}" + ("" if op.ok else f" FAILED: {op.detail}"),
        )
        for op in reversed(journal.read.cache_ops(limit=10_000))
        if start <= op.at <= end
    ]
    for event in events:
        if event.kind not in (CacheClean.__name__, RiskAccepted.__name__):
            continue
        cache = (event.payload or {}).get("cache")
        if not isinstance(cache, str):
            continue
        clean = event.kind == CacheClean.__name__
        note = event.text if clean else event.text.removeprefix(RISK_PREFIX)
        out.append(CacheSample(cache, _seconds(event.at, origin), 0 if clean else None, note))
    out.sort(key=lambda c: c.at_s)
    return out


def _ups_commands(events: list[EventRow], origin: datetime) -> list[UpsCommand]:
    """Each instant command sent to a UPS, from its event's payload. An event journaled
    before payloads were kept says what happened in its line only, and is left out."""
    out: list[UpsCommand] = []
    for event in events:
        fields = event.payload
        if event.kind != UpsCommandSent.__name__ or fields is None:
            continue
        out.append(
            UpsCommand(
                at_s=_seconds(event.at, origin),
                ups=str(fields["ups"]),
                command=str(fields["command"]),
                ok=bool(fields["ok"]),
                detail=str(fields.get("detail") or ""),
                run=str(fields["run"]) if fields.get("run") else None,
            )
        )
    return out
