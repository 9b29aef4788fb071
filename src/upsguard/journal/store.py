"""The journal: every reading, phase change, run, step attempt, cache operation and override.

SQLite in WAL mode, written synchronously from the event loop as events
arrive (``Journal.record`` is an ``EventSink``): when the executor's
``StepFinished`` call returns, the row is on disk, before any dependent step
starts. ``synchronous=NORMAL`` in WAL mode survives the process being killed
(``kill -9``); only a power cut of the controller's own machine can lose the
last transactions, and that machine goes down last.

Readings are downsampled while the site is normal (one per UPS per
``service.readings_every``, and every change of status); while any UPS is on
battery or unreachable every reading is kept.

The journal is a record, not a precondition. Opened for the service (``repair=True``):

- a corrupt journal (not a database, truncated, malformed, of a newer schema) is moved
  aside (``journal.sqlite.bad-<time>``, named in the log) and a fresh one started;
- a journal that cannot be written (read-only, full disk, a directory that cannot be
  made) is an alert, not a stop: the journal goes on in memory (a copy of what could be
  read), keeps the events it could not write, and writes them when ``retry`` finds the
  file writable again.

The file is created mode 0600: it holds who did what, and when.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from upsguard.errors import PermanentError
from upsguard.events import (
    BatteryTestFinished,
    CacheModeChanged,
    CheckupDone,
    Event,
    OverrideApplied,
    PhaseChanged,
    PointOfNoReturn,
    ReadingTaken,
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
from upsguard.journal.file import Corrupt, move_aside, open_file, set_access
from upsguard.journal.rows import (
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
from upsguard.journal.schema import migrate
from upsguard.models import CacheMode, LinkState, Phase, StepState, UpsReading
from upsguard.runs import RunRecord

log = logging.getLogger(__name__)


MAINS_NEVER_LOST = datetime.min.replace(tzinfo=UTC)
"""What ``mains_back_since`` says of a journal that never saw an outage."""
MAX_PENDING = 100_000
"""Events kept in memory while the file cannot be written; past this, readings go first."""

ProblemListener = Callable[[str | None], None]
LineListener = Callable[[EventRow], None]


class Journal:
    def __init__(
        self,
        path: str | Path,
        readings_every: timedelta = timedelta(minutes=1),
        *,
        repair: bool = False,
        on_problem: ProblemListener | None = None,
        group_id: int | None = None,
        on_line: LineListener | None = None,
    ) -> None:
        """``repair``: the service's way of opening (see the module docstring); otherwise a
        journal that cannot be opened is a ``PermanentError`` (the CLI's read commands).
        ``on_problem`` hears each new problem (and None once it is solved).
        ``group_id``: with ``repair``, the socket group that may read the file.
        ``on_line`` hears each line added to the events table (what ``GET /events`` serves)."""
        self.path = str(path)
        self._every = readings_every
        self._on_problem = on_problem
        self._on_line = on_line
        self.problem: str | None = None
        self._pending: list[Event] = []
        self._in_memory = False
        if repair:
            self.db = self._open_repairing()
            if not self._in_memory:
                try:
                    set_access(self.path, group_id)
                except OSError as exc:  # a record, not a precondition: said, then go on
                    log.warning("journal %s: cannot set its permissions (%s)", self.path, exc)
        else:
            try:
                self.db = open_file(self.path)
            except Corrupt as exc:
                raise PermanentError(f"journal {path}: {exc}") from exc
            except (OSError, sqlite3.Error) as exc:
                raise PermanentError(
                    f"journal {path}: cannot open it ({exc}): check the 'journal:' path and the "
                    "permissions of its directory"
                ) from exc
        self._phase = self.last_phase() or Phase.NORMAL
        self._last_reading: dict[str, tuple[datetime, str]] = {}

    def close(self) -> None:
        self.db.close()

    # -- keeping the journal usable -----------------------------------------------------------

    def _open_repairing(self) -> sqlite3.Connection:
        try:
            return open_file(self.path, check=True)
        except Corrupt as exc:
            aside = move_aside(self.path)
            log.warning(
                "journal %s: %s; moved aside to %s, starting a fresh journal", self.path, exc, aside
            )
            try:
                return open_file(self.path)
            except (OSError, sqlite3.Error) as again:
                return self._memory_copy(f"cannot write {self.path}: {again}")
        except (OSError, sqlite3.Error) as exc:
            return self._memory_copy(f"cannot write {self.path}: {exc}")

    def _memory_copy(self, problem: str) -> sqlite3.Connection:
        """Go on in memory, starting from what the file holds when it can be read."""
        memory = sqlite3.connect(":memory:")
        with contextlib.suppress(sqlite3.Error):
            source = sqlite3.connect(f"file:{self.path}?mode=ro&immutable=1", uri=True)
            try:
                source.backup(memory)
            finally:
                source.close()
        try:
            migrate(memory, ":memory:")
        except PermanentError:  # a newer schema could be read but not used: start empty
            memory.close()
            memory = sqlite3.connect(":memory:")
            migrate(memory, ":memory:")
        self._in_memory = True
        self._set_problem(
            f"journal {problem}; keeping records in memory and writing them once it can"
        )
        return memory

    def _set_problem(self, problem: str | None) -> None:
        if problem == self.problem:
            return
        self.problem = problem
        if problem is not None:
            log.error("%s", problem)
        if self._on_problem is not None:
            self._on_problem(problem)

    def retry(self) -> bool:
        """Write what waits in memory to the file, if the file can be written now."""
        if not self._in_memory:
            return True
        try:
            db = self._open_repairing_quietly()
            with db:
                memory, self.db = self.db, db
                try:
                    for event in self._pending:
                        self._write(event)
                except BaseException:
                    self.db = memory
                    raise
        except (OSError, sqlite3.Error, Corrupt):
            return False
        memory.close()
        log.warning(
            "journal %s: writable again; %d event(s) written", self.path, len(self._pending)
        )
        self._pending.clear()
        self._in_memory = False
        self._set_problem(None)
        return True

    def _open_repairing_quietly(self) -> sqlite3.Connection:
        try:
            return open_file(self.path, check=True)
        except Corrupt as exc:
            log.warning("journal %s: %s; moved aside to %s", self.path, exc, move_aside(self.path))
            return open_file(self.path)

    def _safely(self, apply: Callable[[], object], event: Event | None = None) -> None:
        """Apply a write; when the file refuses it, go on in memory and keep the event."""
        try:
            with self.db:
                apply()
        except sqlite3.Error as exc:
            if self._in_memory:
                log.error("journal (in memory): could not record: %s", exc)
                return
            self.db.close()
            self.db = self._memory_copy(f"cannot write {self.path}: {exc}")
            try:
                with self.db:
                    apply()
            except sqlite3.Error as again:
                log.error("journal (in memory): could not record: %s", again)
        if self._in_memory and event is not None:
            self._hold_pending(event)

    def _hold_pending(self, event: Event) -> None:
        self._pending.append(event)
        if len(self._pending) > MAX_PENDING:
            readings = [i for i, e in enumerate(self._pending) if isinstance(e, ReadingTaken)]
            drop = set(readings[: len(self._pending) - MAX_PENDING]) or {0}
            self._pending = [e for i, e in enumerate(self._pending) if i not in drop]

    # -- the event sink ---------------------------------------------------------------------

    def record(self, event: Event) -> None:
        """Write what the event means; never raises (a full disk must not stop a shutdown)."""
        self._safely(lambda: self._write(event), event)

    def _write(self, event: Event) -> None:
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
            self.db.execute(
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
            )
        elif isinstance(event, PointOfNoReturn):
            self.db.execute(
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
            write_checkup(self.db, event)
        elif isinstance(event, BatteryTestFinished):
            write_battery_test(self.db, event)
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
        row_id = self._insert("events", at=at, kind=kind, level=grade, text=line, run=run)
        if self._on_line is not None:
            self._on_line(EventRow(row_id, at, kind, grade, line, run))

    def _insert(self, table: str, **values: object) -> int:
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        cursor = self.db.execute(
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
        self.db.execute(
            "INSERT INTO runs (id, direction, kind, origin, only, feeds, reason, started, state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running')"
            " ON CONFLICT(id) DO UPDATE SET state = 'running', ended = NULL,"
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
            ),
        )

    def _run_finished(self, event: RunFinished) -> None:
        """An interrupted run keeps no end: it is not over, the next start resumes it."""
        ended = None if event.outcome.resumable else iso(event.at)
        self.db.execute(
            "UPDATE runs SET state = ?, ended = ?, detail = ? WHERE id = ? AND state = 'running'",
            (event.outcome.value, ended, event.detail, event.run),
        )

    def _step_started(self, event: StepStarted) -> None:
        self._new_attempt(
            event.run,
            event.step,
            event.action,
            event.at,
            state=StepState.RUNNING.value,
            resource=event.resource,
        )

    def _step_finished(self, event: StepFinished) -> None:
        state = event.state
        row = self.db.execute(
            "SELECT id FROM steps WHERE run = ? AND step = ? AND state = 'running'"
            " ORDER BY id DESC LIMIT 1",
            (event.run, event.step),
        ).fetchone()
        ended = {
            "ended": iso(event.at),
            "state": state.value,
            "detail": event.detail,
            "tries": event.attempts,
            "fallback_used": int(event.fallback_used),
            "already_there": int(event.already_there),
        }
        if row is not None:
            self.db.execute(
                "UPDATE steps SET ended = ?, state = ?, detail = ?, tries = ?, fallback_used = ?,"
                " already_there = ? WHERE id = ?",
                (*ended.values(), row[0]),
            )
        elif state not in (StepState.INTERRUPTED, StepState.ABANDONED):
            # never started: a row says why (skipped, cancelled); nothing to resume from it
            self._new_attempt(
                event.run, event.step, "-", event.at, resource=event.resource, **ended
            )

    def _new_attempt(self, run: str, step: str, action: str, at: datetime, **columns: Any) -> None:
        """A row for the next attempt of a step (attempts count from 1 per run and step)."""
        (attempt,) = self.db.execute(
            "SELECT COUNT(*) FROM steps WHERE run = ? AND step = ?", (run, step)
        ).fetchone()
        self._insert(
            "steps",
            run=run,
            step=step,
            action=action,
            attempt=attempt + 1,
            started=iso(at),
            **columns,
        )

    # -- start-up --------------------------------------------------------------------------------

    def reap(self, at: datetime) -> list[RunRow]:
        """Mark steps a dead controller left running as abandoned; return the unfinished runs."""
        self._safely(
            lambda: self.db.execute(
                "UPDATE steps SET state = 'abandoned', ended = ? WHERE state = 'running'",
                (iso(at),),
            )
        )
        return [r for r in self.runs(limit=50) if r.unfinished]

    def records(self, limit: int = 50) -> list[RunRecord]:
        """The newest runs as the run ledger holds them, oldest first."""
        return [row.record() for row in reversed(self.runs(limit=limit, with_steps=False))]

    def owed_caches(self) -> list[str]:
        """The caches upsguard took out of write-back and has not returned yet."""
        owed: dict[str, bool] = {}
        for cache, mode, was_owed in self.db.execute(
            "SELECT cache, mode, owed FROM cache_ops WHERE ok = 1 ORDER BY id"
        ):
            if mode == CacheMode.WRITE_BACK.value:
                owed[cache] = False
            elif was_owed:
                owed[cache] = True
        return sorted(cache for cache, due in owed.items() if due)

    def pending_requests(self, since: datetime) -> list[RequestRow]:
        """The newest request of each target, made since ``since``, whose step did not end
        done in its run: it may still be landing."""
        rows = self.db.execute(
            "SELECT r.at, r.run, r.step, r.platform, r.target, r.target_kind, r.wanted"
            " FROM requests r WHERE r.id IN"
            " (SELECT MAX(id) FROM requests GROUP BY platform, target) AND r.at >= ?"
            " AND NOT EXISTS (SELECT 1 FROM steps s"
            " WHERE s.run = r.run AND s.step = r.step AND s.state = 'done')"
            " ORDER BY r.id",
            (iso(since),),
        ).fetchall()
        return [RequestRow(*r) for r in rows]

    def close_run(self, run: str, at: datetime, state: str, detail: str) -> None:
        self._safely(
            lambda: self.db.execute(
                "UPDATE runs SET state = ?, ended = ?, detail = ? WHERE id = ?",
                (state, iso(at), detail, run),
            )
        )

    # -- reading back ----------------------------------------------------------------------------

    def mains_back_since(self) -> datetime | None:
        """When every feed was last seen back on mains (None while one is on battery;
        ``MAINS_NEVER_LOST`` when no outage was ever journaled), so that the startup
        policy's ``online_for`` survives a restart."""
        row = self.db.execute(
            "SELECT kind, at FROM events WHERE kind IN ('OnBattery', 'PowerRestored')"
            " ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return MAINS_NEVER_LOST
        return parse_iso(row[1]) if row[0] == "PowerRestored" else None

    def last_phase(self) -> Phase | None:
        row = self.db.execute("SELECT new FROM phases ORDER BY id DESC LIMIT 1").fetchone()
        return Phase(row[0]) if row else None

    def hold(self) -> OverrideRow | None:
        """The hold in force: the last hold not followed by a release."""
        row = self.db.execute(
            "SELECT at, who, action, reason, detail FROM overrides"
            " WHERE action IN ('hold', 'release') ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None or row[2] != "hold":
            return None
        return OverrideRow(*row)

    def phases(self, limit: int = 50) -> list[PhaseRow]:
        rows = self.db.execute(
            "SELECT at, old, new, reason FROM phases ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [PhaseRow(*r) for r in rows]

    def runs(self, limit: int = 20, with_steps: bool = True) -> list[RunRow]:
        rows = self.db.execute(
            "SELECT id, direction, kind, origin, only, reason, started, ended, state, detail,"
            " point_of_no_return, resumed, feeds FROM runs"
            " ORDER BY started DESC, rowid DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [_run_row(r, tuple(self.steps(r[0])) if with_steps else ()) for r in rows]

    def run(self, run_id: str) -> RunRow | None:
        return next((r for r in self.runs(limit=1000) if r.id == run_id), None)

    def steps(self, run: str) -> list[StepRow]:
        rows = self.db.execute(
            "SELECT run, step, action, attempt, started, ended, state, detail, tries,"
            " fallback_used, resource, already_there FROM steps WHERE run = ? ORDER BY id",
            (run,),
        ).fetchall()
        return [_step_row(r) for r in rows]

    def finished_steps(self, before: str | None = None) -> list[tuple[StepRow, str]]:
        """Every step attempt that ran and ended ``done``, each with its run's direction,
        newest run first (what durations are learned from). ``before``: only runs that
        started before this ISO time. Steps that never started (skipped, cancelled, a
        barrier) have no duration and are left out."""
        where = "AND r.started < ?" if before is not None else ""
        rows = self.db.execute(
            "SELECT s.run, s.step, s.action, s.attempt, s.started, s.ended, s.state, s.detail,"
            " s.tries, s.fallback_used, s.resource, s.already_there, r.direction"
            " FROM steps s JOIN runs r ON r.id = s.run"
            f" WHERE s.state = 'done' AND s.ended IS NOT NULL AND s.action != '-' {where}"
            " ORDER BY r.started DESC, r.rowid DESC, s.id",
            () if before is None else (before,),
        ).fetchall()
        return [(_step_row(r[:12]), r[12]) for r in rows]

    def readings_between(self, start: str, end: str) -> list[ReadingRow]:
        """Readings from ``start`` to ``end`` (ISO times), oldest first."""
        rows = self.db.execute(
            "SELECT at, ups, status, charge, runtime, load, input_voltage, link FROM readings"
            " WHERE at >= ? AND at <= ? ORDER BY id",
            (start, end),
        ).fetchall()
        return [ReadingRow(*r) for r in rows]

    def events_between(self, start: str, end: str) -> list[EventRow]:
        """Events from ``start`` to ``end`` (ISO times), oldest first."""
        rows = self.db.execute(
            "SELECT id, at, kind, level, text, run FROM events WHERE at >= ? AND at <= ?"
            " ORDER BY id",
            (start, end),
        ).fetchall()
        return [EventRow(*r) for r in rows]

    def readings(self, limit: int = 100, ups: str | None = None) -> list[ReadingRow]:
        where, args = ("WHERE ups = ?", [ups]) if ups else ("", [])
        rows = self.db.execute(
            "SELECT at, ups, status, charge, runtime, load, input_voltage, link FROM readings "
            f"{where} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [ReadingRow(*r) for r in rows]

    def cache_ops(self, limit: int = 50) -> list[CacheOpRow]:
        rows = self.db.execute(
            "SELECT at, cache, target, mode, ok, detail FROM cache_ops ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [CacheOpRow(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in rows]

    def overrides(self, limit: int = 50) -> list[OverrideRow]:
        rows = self.db.execute(
            "SELECT at, who, action, reason, detail FROM overrides ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [OverrideRow(*r) for r in rows]

    def events(self, after: int = 0, limit: int = 200) -> list[EventRow]:
        """Events with an id above ``after``, oldest first; ``after=-N`` gives the last N."""
        if after < 0:
            rows = self.db.execute(
                "SELECT id, at, kind, level, text, run FROM events ORDER BY id DESC LIMIT ?",
                (-after,),
            ).fetchall()
            rows.reverse()
        else:
            rows = self.db.execute(
                "SELECT id, at, kind, level, text, run FROM events WHERE id > ? ORDER BY id"
                " LIMIT ?",
                (after, limit),
            ).fetchall()
        return [EventRow(*r) for r in rows]

    def prune_readings(self, now: datetime, keep: timedelta) -> int:
        before = self.db.total_changes
        self._safely(
            lambda: self.db.execute("DELETE FROM readings WHERE at < ?", (iso(now - keep),))
        )
        return self.db.total_changes - before


def _run_row(r: tuple[Any, ...], steps: tuple[StepRow, ...]) -> RunRow:
    return RunRow(
        id=r[0],
        direction=r[1],
        kind=r[2],
        origin=r[3],
        only=RunRow.list_of(r[4]),
        reason=r[5],
        started=r[6],
        ended=r[7],
        state=r[8],
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
        state=r[6],
        detail=r[7],
        tries=r[8],
        fallback_used=bool(r[9]),
        resource=r[10],
        already_there=bool(r[11]),
    )


__all__ = ["Journal", "parse_iso"]
