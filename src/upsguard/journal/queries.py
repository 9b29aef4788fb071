"""What comes out of the journal: runs, steps, phases, readings, events, overrides, caches,
and what a restarted controller takes up (the ledger's records, the hold, the caches owed
write-back, the requests that may still be landing)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from upsguard.journal.payload import from_json
from upsguard.journal.rows import (
    NEVER_STARTED,
    CacheOpRow,
    EventRow,
    OverrideRow,
    PhaseRow,
    ReadingRow,
    RequestRow,
    RunRow,
    StepRow,
    iso,
    parse_iso,
)
from upsguard.models import CacheMode, Direction, LinkState, Phase, StepState
from upsguard.runs import RunKind, RunOrigin, RunRecord, RunState

MAINS_NEVER_LOST = datetime.min.replace(tzinfo=UTC)
"""What ``mains_back_since`` says of a journal that never saw an outage."""


EVENT_COLUMNS = "id, at, kind, level, text, run, payload"
"""What ``_event_row`` reads."""

Connection = Callable[[], sqlite3.Connection]
"""The journal's connection now (the file's, or the memory copy while it cannot be written)."""


class JournalQueries:
    def __init__(self, connection: Connection) -> None:
        self._db = connection

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return list(self._db().execute(sql, args).fetchall())

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._db().execute(sql, args).fetchone()
        return row

    def records(self, limit: int = 50) -> list[RunRecord]:
        """The newest runs as the run ledger holds them, oldest first."""
        return [row.record() for row in reversed(self.runs(limit=limit, with_steps=False))]

    def owed_caches(self) -> list[str]:
        """The caches upsguard took out of write-back and has not returned yet."""
        owed: dict[str, bool] = {}
        for cache, mode, was_owed in self._rows(
            "SELECT cache, mode, owed FROM cache_ops WHERE ok = 1 ORDER BY id"
        ):
            if CacheMode(mode) is CacheMode.WRITE_BACK:
                owed[cache] = False
            elif was_owed:
                owed[cache] = True
        return sorted(cache for cache, due in owed.items() if due)

    def pending_requests(self, since: datetime) -> list[RequestRow]:
        """The newest request of each target, made since ``since``, that did not fail
        (``RequestFailed``) and whose step did not end done after it (an attempt of the same
        step that ended done before the request, in a run resumed since, says nothing of it):
        it may still be landing."""
        rows = self._rows(
            "SELECT r.at, r.run, r.step, r.platform, r.target, r.target_kind, r.wanted,"
            " r.pid, r.pid_start, r.session, r.exit_file"
            " FROM requests r WHERE r.id IN"
            " (SELECT MAX(id) FROM requests GROUP BY platform, target) AND r.at >= ?"
            " AND r.failed = 0"
            " AND NOT EXISTS (SELECT 1 FROM steps s"
            " WHERE s.run = r.run AND s.step = r.step AND s.state = ? AND s.ended >= r.at)"
            " ORDER BY r.id",
            (iso(since), StepState.DONE.value),
        )
        return [RequestRow(*r) for r in rows]

    def mains_back_since(self) -> datetime | None:
        """When every feed was last seen back on mains (None while one is on battery;
        ``MAINS_NEVER_LOST`` when no outage was ever journaled), so that the startup
        policy's ``online_for`` survives a restart."""
        row = self._one(
            "SELECT kind, at FROM events WHERE kind IN ('OnBattery', 'PowerRestored')"
            " ORDER BY id DESC LIMIT 1"
        )
        if row is None:
            return MAINS_NEVER_LOST
        return parse_iso(row[1]) if row[0] == "PowerRestored" else None

    def last_phase(self) -> Phase | None:
        row = self._one("SELECT new FROM phases ORDER BY id DESC LIMIT 1")
        return Phase(row[0]) if row else None

    def hold(self) -> OverrideRow | None:
        """The hold in force: the last hold not followed by a release."""
        row = self._one(
            "SELECT at, who, action, reason, detail FROM overrides"
            " WHERE action IN ('hold', 'release') ORDER BY id DESC LIMIT 1"
        )
        if row is None or row[2] != "hold":
            return None
        return OverrideRow(*row)

    def phases(self, limit: int = 50) -> list[PhaseRow]:
        rows = self._rows(
            "SELECT at, old, new, reason FROM phases ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [PhaseRow(at, Phase(old), Phase(new), reason) for at, old, new, reason in rows]

    def runs(
        self, limit: int = 20, with_steps: bool = True, started_by: str | None = None
    ) -> list[RunRow]:
        """The newest runs first; ``started_by``: only those started then or earlier."""
        since = "" if started_by is None else " WHERE started <= ?"
        rows = self._rows(
            "SELECT id, direction, kind, origin, only, reason, started, ended, state, detail,"
            f" point_of_no_return, resumed, feeds FROM runs{since}"
            " ORDER BY started DESC, rowid DESC LIMIT ?",
            (limit,) if started_by is None else (started_by, limit),
        )
        return [_run_row(r, tuple(self.steps(r[0])) if with_steps else ()) for r in rows]

    def run(self, run_id: str) -> RunRow | None:
        return next((r for r in self.runs(limit=1000) if r.id == run_id), None)

    def steps(self, run: str) -> list[StepRow]:
        rows = self._rows(
            "SELECT run, step, action, attempt, started, ended, state, detail, tries,"
            " fallback_used, resource, already_there, member FROM steps WHERE run = ? ORDER BY id",
            (run,),
        )
        return [_step_row(r) for r in rows]

    def finished_steps(self, before: str | None = None) -> list[tuple[StepRow, Direction]]:
        """Every step attempt that ran and ended ``done``, each with its run's direction,
        newest run first (what durations are learned from). ``before``: only runs that
        started before this ISO time. Steps that never started (skipped, cancelled, a
        barrier) have no duration and are left out."""
        where = "AND r.started < ?" if before is not None else ""
        rows = self._rows(
            "SELECT s.run, s.step, s.action, s.attempt, s.started, s.ended, s.state, s.detail,"
            " s.tries, s.fallback_used, s.resource, s.already_there, s.member, r.direction"
            " FROM steps s JOIN runs r ON r.id = s.run"
            f" WHERE s.state = ? AND s.ended IS NOT NULL AND s.action != ? {where}"
            " ORDER BY r.started DESC, r.rowid DESC, s.id",
            (StepState.DONE.value, NEVER_STARTED, *(() if before is None else (before,))),
        )
        return [(_step_row(r[:13]), Direction(r[13])) for r in rows]

    def readings_between(self, start: str, end: str) -> list[ReadingRow]:
        """Readings from ``start`` to ``end`` (ISO times), oldest first."""
        rows = self._rows(
            "SELECT at, ups, status, charge, runtime, load, input_voltage, link FROM readings"
            " WHERE at >= ? AND at <= ? ORDER BY id",
            (start, end),
        )
        return [_reading_row(r) for r in rows]

    def events_between(self, start: str, end: str) -> list[EventRow]:
        """Events from ``start`` to ``end`` (ISO times), oldest first."""
        rows = self._rows(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE at >= ? AND at <= ? ORDER BY id",
            (start, end),
        )
        return [_event_row(r) for r in rows]

    def power_events(self, after: str | None, until: str | None) -> list[EventRow]:
        """The feeds' ``OnBattery`` and ``PowerRestored`` events after ``after`` up to
        ``until`` (ISO times; None: no bound), oldest first."""
        rows = self._rows(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE kind IN ('OnBattery', 'PowerRestored')"
            " AND (? IS NULL OR at > ?) AND (? IS NULL OR at <= ?) ORDER BY id",
            (after, after, until, until),
        )
        return [_event_row(r) for r in rows]

    def upses_told(self, run: str) -> dict[str, datetime]:
        """The UPSes whose end-of-outage command run ``run`` sent and they took, and when:
        a resumed run does not send them a second one, nor counts on a load cycle spent."""
        rows = self._rows(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE kind = 'UpsCommandSent' AND run = ? "
            "ORDER BY id",
            (run,),
        )
        sent = (_event_row(r) for r in rows)
        return {
            str(e.payload["ups"]): parse_iso(e.at)
            for e in sent
            if e.payload is not None and e.payload.get("ok")
        }

    def readings(self, limit: int = 100, ups: str | None = None) -> list[ReadingRow]:
        where, args = ("WHERE ups = ?", [ups]) if ups else ("", [])
        rows = self._rows(
            "SELECT at, ups, status, charge, runtime, load, input_voltage, link FROM readings "
            f"{where} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [_reading_row(r) for r in rows]

    def cache_ops(self, limit: int = 50) -> list[CacheOpRow]:
        rows = self._rows(
            "SELECT at, cache, target, mode, ok, detail FROM cache_ops ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [CacheOpRow(r[0], r[1], r[2], CacheMode(r[3]), bool(r[4]), r[5]) for r in rows]

    def overrides(self, limit: int = 50) -> list[OverrideRow]:
        rows = self._rows(
            "SELECT at, who, action, reason, detail FROM overrides ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [OverrideRow(*r) for r in rows]

    def events(self, after: int = 0, limit: int = 200) -> list[EventRow]:
        """Events with an id above ``after``, oldest first; ``after=-N`` gives the last N."""
        if after < 0:
            rows = self._rows(
                f"SELECT {EVENT_COLUMNS} FROM events ORDER BY id DESC LIMIT ?",
                (-after,),
            )
            rows.reverse()
        else:
            rows = self._rows(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit),
            )
        return [_event_row(r) for r in rows]


def _event_row(r: tuple[Any, ...]) -> EventRow:
    row_id, at, kind, level, text, run, payload = r
    return EventRow(row_id, at, kind, level, text, run, from_json(payload))


def _reading_row(r: tuple[Any, ...]) -> ReadingRow:
    at, ups, status, charge, runtime, load, input_voltage, link = r
    return ReadingRow(at, ups, status, charge, runtime, load, input_voltage, LinkState(link))


def _run_row(r: tuple[Any, ...], steps: tuple[StepRow, ...]) -> RunRow:
    """A run as ``JournalWriter`` wrote it; its text columns become the enums they name
    here, once, so that nothing past this module compares strings."""
    return RunRow(
        id=r[0],
        direction=Direction(r[1]),
        kind=RunKind(r[2]),
        origin=RunOrigin(r[3]),
        only=RunRow.list_of(r[4]),
        reason=r[5],
        started=r[6],
        ended=r[7],
        state=RunState(r[8]),
        detail=r[9],
        point_of_no_return=r[10],
        resumed=r[11],
        feeds=RunRow.list_of(r[12]),
        steps=steps,
    )


def _step_row(r: tuple[Any, ...]) -> StepRow:
    return StepRow(
        run=r[0],
        step=r[1],
        action=r[2],
        attempt=r[3],
        started=r[4],
        ended=r[5],
        state=StepState(r[6]),
        detail=r[7],
        tries=r[8],
        fallback_used=bool(r[9]),
        resource=r[10],
        already_there=bool(r[11]),
        member=bool(r[12]),
    )
