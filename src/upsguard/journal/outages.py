"""Outages as the journal tells them: what one report covers.

A person wants one report per outage: the mains failure, the shutdown, the return of power
and the startup, on one timeline. The journal has no outage row; the phases draw it. An
outage is the site's time away from ``normal``: from the phase change that left ``normal``
to the one that came back to it (``on_battery -> shutting_down -> down -> recovering``; a
``recovering`` that goes on battery again is the same outage). Its runs are those that
started inside it: shedding, shutdown, and the startup after the power came back.

A person's ``trigger shutdown`` moves the phase too: a drill is an outage without a mains
failure. A run that moved no phase (``trigger startup --only`` on mains) is reported as an
outage of its own, so every run belongs to exactly one outage.

The mains failure is read from the feeds' ``OnBattery`` events, not from the phase change:
the phase follows the on-battery policy's debounce (``on_battery.after``), the mains went
that much earlier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from upsguard.events import OnBattery
from upsguard.journal.rows import EventRow, RunRow, iso, parse_iso
from upsguard.journal.store import Journal
from upsguard.models import Phase

TRIGGER_SLACK = timedelta(seconds=1)
"""A person's trigger records its run a moment before the phase change it forces: a run
that started this little before an outage is one of its runs."""
READ_ALL = 1_000_000
"""Enough rows of the phases and runs tables for any journal (a few per outage)."""


@dataclass(frozen=True, slots=True)
class Outage:
    started: datetime
    """The phase change away from ``normal`` (for a run that moved no phase, its start)."""
    ended: datetime | None
    """The return to ``normal``; None while the outage goes on."""
    runs: tuple[RunRow, ...] = ()
    """Oldest first, with their steps."""
    mains_failed: datetime | None = None
    """When the feeds on battery as the outage began went on battery; None for a drill, a
    person's trigger on mains, or a run that moved no phase."""
    mains_back: datetime | None = None
    """When the last feed came back on mains for good, inside the outage; None while one
    is still on battery, or when the mains never failed."""

    @property
    def origin(self) -> datetime:
        """Where a report counts its T+ from: the mains failure, else the first phase change."""
        return self.mains_failed or self.started


def outages(journal: Journal) -> list[Outage]:
    """Every outage of the journal, oldest first, with its runs (without their steps)."""
    left = sorted(journal.read.runs(limit=READ_ALL, with_steps=False), key=lambda r: r.started)
    found: list[Outage] = []
    before: str | None = None  # where the outage before ended
    for start, end in _spans(journal):
        early = iso(parse_iso(start) - TRIGGER_SLACK)
        mine = tuple(r for r in left if early <= r.started and (end is None or r.started <= end))
        left = [r for r in left if r not in mine]
        failed, back = _mains(journal, before, start, end)
        ended = parse_iso(end) if end is not None else None
        found.append(Outage(parse_iso(start), ended, mine, failed, back))
        before = end
    for run in left:  # moved no phase
        ended = parse_iso(run.ended) if run.ended else None
        found.append(Outage(parse_iso(run.started), ended, (run,)))
    return sorted(found, key=lambda o: o.started)


def last_outage(journal: Journal) -> Outage | None:
    """The newest outage, its runs with their steps; None when the journal has none."""
    found = outages(journal)
    return with_steps(journal, found[-1]) if found else None


def outage_of(journal: Journal, run_id: str) -> Outage | None:
    """The outage a run belongs to, for its times (its runs without their steps: a report of
    one run has that run's steps already)."""
    return next((o for o in outages(journal) if any(r.id == run_id for r in o.runs)), None)


def with_steps(journal: Journal, outage: Outage) -> Outage:
    runs = tuple(replace(r, steps=tuple(journal.read.steps(r.id))) for r in outage.runs)
    return replace(outage, runs=runs)


def _spans(journal: Journal) -> list[tuple[str, str | None]]:
    """(left ``normal``, back to ``normal`` or None) for each time away, oldest first."""
    spans: list[tuple[str, str | None]] = []
    start: str | None = None
    for phase in reversed(journal.read.phases(limit=READ_ALL)):  # oldest first
        if phase.new is Phase.NORMAL and start is not None:
            spans.append((start, phase.at))
            start = None
        elif phase.new is not Phase.NORMAL and start is None:
            start = phase.at
    if start is not None:
        spans.append((start, None))
    return spans


def _mains(
    journal: Journal, after: str | None, start: str, end: str | None
) -> tuple[datetime | None, datetime | None]:
    """The mains failure that led to the outage beginning at ``start``: the earliest
    ``OnBattery`` of the feeds still on battery then (counted since ``after``, the outage
    before). The mains return: the ``PowerRestored`` inside the outage that left no feed on
    battery, with no failure after it."""
    events = journal.read.power_events(after, end)
    on_battery: dict[str, str] = {}
    for event in (e for e in events if e.at <= start):
        _replay(on_battery, event)
    failed = min(on_battery.values(), default=None)
    back: str | None = None
    for event in (e for e in events if e.at > start):
        _replay(on_battery, event)
        back = event.at if not on_battery else None
    if failed is None:
        return None, None
    return parse_iso(failed), parse_iso(back) if back is not None else None


def _replay(on_battery: dict[str, str], event: EventRow) -> None:
    """Since when each feed is on battery, after ``event``."""
    if event.kind == OnBattery.__name__:
        on_battery.setdefault(_feed(event), event.at)
    else:
        on_battery.pop(_feed(event), None)


def _feed(event: EventRow) -> str:
    """The feed an event is about, from its payload. An event journaled before payloads
    were kept names none: the site's mains are then taken as one."""
    feed = (event.payload or {}).get("feed")
    return feed if isinstance(feed, str) else ""
