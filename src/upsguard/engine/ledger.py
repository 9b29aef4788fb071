"""The run ledger: the one owner of every run's life.

Every change of a run goes through here (started, widened, point of no return, finished),
and each change is announced as an event (``RunStarted``, ``RunWidened``,
``PointOfNoReturn``, ``RunFinished``) that the journal, log, metrics and notifier
consume. The phase engine reads ``site()``; status and metrics read ``active``. On start
the service restores the ledger from the journal (``restore``), so a restarted controller
knows the runs of the one before it.

The records live in memory. A controller of a pair also gives each change to a
``LedgerSink`` (``engine.pair``), which writes it to the shared store, fenced, for the
standby; the standby's ledger ``follow``s what the store holds, and the controller that
wins the lease takes it from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from upsguard.clock import Clock
from upsguard.events import EventSink, PointOfNoReturn, RunFinished, RunStarted, RunWidened
from upsguard.models import ResourceId, RunId, StepId
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunRecord, RunSpec, SiteRuns

KEEP_RECORDS = 50
"""The phase engine needs only the newest runs; older ones stay in the journal."""


class LedgerSink(Protocol):
    """Told every change of a record, in order, as it happens (never on ``restore`` or
    ``follow``). It must not block: a store's writes are its own business."""

    def changed(self, record: RunRecord) -> None: ...

    def forgotten(self, run: RunId) -> None:
        """The ledger no longer keeps ``run`` (only the newest runs are kept)."""
        ...


class RunLedger:
    def __init__(self, clock: Clock, events: EventSink, sink: LedgerSink | None = None) -> None:
        self._clock = clock
        self._events = events
        self._sink = sink
        self._records: dict[RunId, RunRecord] = {}  # oldest first
        self._sequence = 0

    # -- reading --------------------------------------------------------------------------

    def newest_first(self) -> list[RunRecord]:
        return list(reversed(self._records.values()))

    def get(self, run: RunId) -> RunRecord | None:
        return self._records.get(run)

    @property
    def active(self) -> RunRecord | None:
        """The run in progress (at most one runs at a time)."""
        return next((r for r in self.newest_first() if r.active), None)

    def site(self) -> SiteRuns:
        return SiteRuns.of(self.newest_first())

    # -- changing ---------------------------------------------------------------------------

    def new_spec(
        self,
        kind: RunKind,
        origin: RunOrigin,
        reason: str,
        only: Iterable[ResourceId] | None = None,
        feeds: Iterable[str] | None = None,
    ) -> RunSpec:
        """A new run's spec; its id names its kind and time and never repeats one journaled
        by an earlier process (milliseconds, and a sequence within this one)."""
        self._sequence += 1
        now = self._clock.now()
        run = RunId(f"{kind}-{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{self._sequence}")
        chosen = tuple(sorted(only)) if only is not None else None
        scope = tuple(sorted(feeds)) if feeds is not None else None
        return RunSpec(run, kind, origin, reason, now, chosen, scope)

    def started(self, spec: RunSpec, steps: int) -> None:
        resumed = self._records.pop(spec.id, None) is not None  # a resumed run is the newest
        self._put(RunRecord(spec))
        self._events(RunStarted(self._clock.now(), spec, steps, resumed))

    def widened(self, spec: RunSpec, steps: int, reason: str) -> None:
        """A running run's scope grew (its feeds and resources): same id, same start."""
        record = self._records[spec.id]
        if record.active:
            self._put(replace(record, spec=spec))
            self._events(RunWidened(self._clock.now(), spec, steps, reason))

    def point_of_no_return(self, run: RunId, step: StepId) -> None:
        record = self._records[run]
        if record.point_of_no_return is None:
            self._put(replace(record, point_of_no_return=step))
            self._events(PointOfNoReturn(self._clock.now(), run, step))

    def finished(self, run: RunId, outcome: RunOutcome, detail: str = "") -> None:
        record = self._records[run]
        if not record.active:
            return  # finished once; a second word (a cancel racing the end) changes nothing
        now = self._clock.now()
        self._put(replace(record, outcome=outcome, detail=detail, ended=now))
        self._events(RunFinished(now, record.spec, outcome, detail))

    def restore(self, records: Iterable[RunRecord]) -> None:
        """The runs a previous controller journaled, oldest first; no events."""
        for record in records:
            self._put(record, tell=False)

    def follow(self, records: Iterable[RunRecord]) -> None:
        """The runs as the pair's shared store holds them, oldest first, in place of these
        (a standby following the leader, or the leader taking over); no events."""
        self._records = {}
        self.restore(records)

    def _put(self, record: RunRecord, tell: bool = True) -> None:
        """Replace a record in place, or add it as the newest."""
        self._records[record.spec.id] = record
        if tell and self._sink is not None:
            self._sink.changed(record)
        while len(self._records) > KEEP_RECORDS:
            oldest = next(iter(self._records))
            if self._records[oldest].active:
                break
            del self._records[oldest]
            if tell and self._sink is not None:
                self._sink.forgotten(oldest)
