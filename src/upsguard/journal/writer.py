"""What goes into the journal: each event as the rows it means.

``JournalWriter.record`` is an ``EventSink``: the service's bus calls it synchronously, so
when a producer's call returns its row is written. Every write goes through the store's
``safely``: a journal that cannot be written goes on in memory and keeps the event.

Readings are downsampled while the site is normal (one per UPS per
``service.readings_every``, and every change of status); while any UPS is on battery or
unreachable every reading is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from upsguard.events import (
    BatteryTestFinished,
    CacheModeChanged,
    CheckupDone,
    Event,
    OverrideApplied,
    PhaseChanged,
    PointOfNoReturn,
    ReadingTaken,
    RequestFailed,
    RunFinished,
    RunStarted,
    RunWidened,
    StepFinished,
    StepStarted,
    TargetAsked,
    describe,
    level,
)
from upsguard.journal.checkups import write_battery_test, write_checkup
from upsguard.journal.payload import fields_of, to_json
from upsguard.journal.queries import Connection, JournalQueries
from upsguard.journal.rows import NEVER_STARTED, EventRow, RunRow, iso
from upsguard.models import CommandProcess, LinkState, Phase, StepState, UpsReading
from upsguard.runs import RunOutcome, RunState

LineListener = Callable[[EventRow], None]


Safely = Callable[[Callable[[], object], Event | None], None]
"""The store's way to apply a write: in a transaction, or in memory when the file refuses."""


class JournalWriter:
    def __init__(
        self,
        connection: Connection,
        safely: Safely,
        queries: JournalQueries,
        readings_every: timedelta,
        on_line: LineListener | None = None,
    ) -> None:
        """``on_line`` hears each line added to the events table (what ``GET /events``
        serves)."""
        self._db = connection
        self._safely = safely
        self._read = queries
        self._every = readings_every
        self._on_line = on_line
        self._phase = queries.last_phase() or Phase.NORMAL
        self._last_reading: dict[str, tuple[datetime, str]] = {}

    def record(self, event: Event) -> None:
        """Write what the event means; never raises (a full disk must not stop a shutdown)."""
        self._safely(lambda: self.apply(event), event)

    def apply(self, event: Event) -> None:
        """The rows an event makes, written in the store's transaction."""
        if isinstance(event, ReadingTaken):
            self._reading(event.reading)
            return
        if isinstance(event, PhaseChanged):
            self._phase = event.new
            self._insert(
                "phases", at=iso(event.at), old=event.old, new=event.new, reason=event.reason
            )
        elif isinstance(event, RunStarted):
            self._run_started(event)
        elif isinstance(event, RunFinished):
            self._run_finished(event)
        elif isinstance(event, RunWidened):
            spec = event.spec
            self._db().execute(
                "UPDATE runs SET only = ?, feeds = ? WHERE id = ?",
                (RunRow.list_text(spec.only), RunRow.list_text(spec.feeds), spec.id),
            )
        elif isinstance(event, TargetAsked):
            self._insert(
                "requests",
                at=iso(event.at),
                run=event.run,
                step=event.step,
                platform=event.platform,
                target=event.target,
                target_kind=event.target_kind.value,
                wanted=event.wanted.value,
                **_process_columns(event.process),
            )
        elif isinstance(event, RequestFailed):
            self._db().execute(
                "UPDATE requests SET failed = 1 WHERE id = (SELECT MAX(id) FROM requests"
                " WHERE run = ? AND step = ? AND platform = ? AND target = ?)",
                (event.run, event.step, event.platform, event.target),
            )
        elif isinstance(event, PointOfNoReturn):
            self._db().execute(
                "UPDATE runs SET point_of_no_return = ? WHERE id = ?", (event.step, event.run)
            )
        elif isinstance(event, StepStarted):
            self._step_started(event)
        elif isinstance(event, StepFinished):
            self._step_finished(event)
        elif isinstance(event, OverrideApplied):
            self._insert(
                "overrides",
                at=iso(event.at),
                who=event.who,
                action=event.action,
                reason=event.reason,
                detail=event.detail,
            )
        elif isinstance(event, CheckupDone):
            write_checkup(self._db(), event)
        elif isinstance(event, BatteryTestFinished):
            write_battery_test(self._db(), event)
        elif isinstance(event, CacheModeChanged):
            self._insert(
                "cache_ops",
                at=iso(event.at),
                cache=event.cache,
                target=event.target,
                mode=event.mode.value,
                ok=int(event.ok),
                detail=event.detail,
                owed=int(event.owed),
            )
        self._event_line(event)

    def _event_line(self, event: Event) -> None:
        text = describe(event)
        if text is None:
            return
        run = getattr(event, "run", None)
        at, kind, grade, line = iso(event.at), event.kind, level(event), text.strip()
        fields = fields_of(event)
        row_id = self._insert(
            "events", at=at, kind=kind, level=grade, text=line, run=run, payload=to_json(fields)
        )
        if self._on_line is not None:
            self._on_line(EventRow(row_id, at, kind, grade, line, run, fields))

    def _insert(self, table: str, **values: object) -> int:
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        cursor = self._db().execute(
            f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(values.values())
        )
        return int(cursor.lastrowid or 0)

    # -- readings ---------------------------------------------------------------------------

    def _reading(self, reading: UpsReading) -> None:
        status = " ".join(sorted(f.value for f in reading.flags))
        if not self._keep(reading, status):
            return
        self._last_reading[reading.ups] = (reading.at, status + reading.link.value)
        self._insert(
            "readings",
            at=iso(reading.at),
            ups=reading.ups,
            status=status,
            charge=reading.charge_pct,
            runtime=reading.runtime_s,
            load=reading.load_pct,
            input_voltage=reading.input_voltage,
            link=reading.link.value,
        )

    def _keep(self, reading: UpsReading, status: str) -> bool:
        if self._phase is not Phase.NORMAL or reading.on_battery:
            return True
        if reading.link is not LinkState.OK:
            return True
        last = self._last_reading.get(reading.ups)
        if last is None or last[1] != status + reading.link.value:
            return True
        return reading.at - last[0] >= self._every

    # -- runs and steps -----------------------------------------------------------------------

    def _run_started(self, event: RunStarted) -> None:
        """A new run, or a resumed one (the same id): running again, counted as resumed."""
        spec = event.spec
        self._db().execute(
            "INSERT INTO runs (id, direction, kind, origin, only, feeds, reason, started, state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET state = excluded.state, ended = NULL,"
            " resumed = resumed + 1",
            (
                spec.id,
                spec.direction.value,
                spec.kind.value,
                spec.origin.value,
                RunRow.list_text(spec.only),
                RunRow.list_text(spec.feeds),
                spec.reason,
                iso(spec.at),
                RunState.RUNNING.value,
            ),
        )

    def _run_finished(self, event: RunFinished) -> None:
        """An interrupted run keeps no end: it is not over, the next start resumes it."""
        ended = None if event.outcome.resumable else iso(event.at)
        self._db().execute(
            "UPDATE runs SET state = ?, ended = ?, detail = ? WHERE id = ? AND state = ?",
            (event.outcome.value, ended, event.detail, event.run, RunState.RUNNING.value),
        )

    def _step_started(self, event: StepStarted) -> None:
        self._new_attempt(
            event.run,
            event.step,
            event.action,
            event.at,
            state=StepState.RUNNING.value,
            resource=event.resource,
            member=int(event.member),
        )

    def _step_finished(self, event: StepFinished) -> None:
        state = event.state
        row = (
            self._db()
            .execute(
                "SELECT id FROM steps WHERE run = ? AND step = ? AND state = ?"
                " ORDER BY id DESC LIMIT 1",
                (event.run, event.step, StepState.RUNNING.value),
            )
            .fetchone()
        )
        ended = {
            "ended": iso(event.at),
            "state": state.value,
            "detail": event.detail,
            "tries": event.attempts,
            "fallback_used": int(event.fallback_used),
            "already_there": int(event.already_there),
        }
        if row is not None:
            self._db().execute(
                "UPDATE steps SET ended = ?, state = ?, detail = ?, tries = ?, fallback_used = ?,"
                " already_there = ? WHERE id = ?",
                (*ended.values(), row[0]),
            )
        elif state not in (StepState.INTERRUPTED, StepState.ABANDONED):
            # never started: a row says why (skipped, cancelled); nothing to resume from it
            self._new_attempt(
                event.run,
                event.step,
                NEVER_STARTED,
                event.at,
                resource=event.resource,
                member=int(event.member),
                **ended,
            )

    def _new_attempt(self, run: str, step: str, action: str, at: datetime, **columns: Any) -> None:
        """A row for the next attempt of a step (attempts count from 1 per run and step)."""
        (attempt,) = (
            self._db()
            .execute("SELECT COUNT(*) FROM steps WHERE run = ? AND step = ?", (run, step))
            .fetchone()
        )
        self._insert(
            "steps",
            run=run,
            step=step,
            action=action,
            attempt=attempt + 1,
            started=iso(at),
            **columns,
        )

    # -- start-up and housekeeping ------------------------------------------------------

    def reap(self, at: datetime) -> list[RunRow]:
        """Mark steps a dead controller left running as abandoned; return the unfinished runs."""
        self._safely(
            lambda: self._db().execute(
                "UPDATE steps SET state = ?, ended = ? WHERE state = ?",
                (StepState.ABANDONED.value, iso(at), StepState.RUNNING.value),
            ),
            None,
        )
        return [r for r in self._read.runs(limit=50) if r.unfinished]

    def close_run(self, run: str, at: datetime, outcome: RunOutcome, detail: str) -> None:
        """End a run no process will finish (superseded, aborted while stopped, finished by
        the controller's own poweroff)."""
        self._safely(
            lambda: self._db().execute(
                "UPDATE runs SET state = ?, ended = ?, detail = ? WHERE id = ?",
                (outcome.value, iso(at), detail, run),
            ),
            None,
        )

    def prune_readings(self, now: datetime, keep: timedelta) -> int:
        before = self._db().total_changes
        self._safely(
            lambda: self._db().execute("DELETE FROM readings WHERE at < ?", (iso(now - keep),)),
            None,
        )
        return self._db().total_changes - before


def _process_columns(process: CommandProcess | None) -> dict[str, int | str | None]:
    """A request's process, as the ``requests`` table keeps it (its start is the row's
    ``at``); all NULL for a request that is not a command running here."""
    if process is None:
        return {"pid": None, "pid_start": None, "session": None, "exit_file": None}
    return {
        "pid": process.pid,
        "pid_start": process.start_ticks,
        "session": process.session,
        "exit_file": process.exit_file,
    }
