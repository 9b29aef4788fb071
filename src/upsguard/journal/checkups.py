"""The journal's record of the scheduled checks and battery tests (tables ``checkups``,
``checks`` and ``battery_tests``, schema 3): written from their events, read back to say what
broke since the last checkup, when a UPS was last tested, and for ``upsguard battery``."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime

from upsguard.events import BatteryTestFinished, CheckupDone
from upsguard.findings import Area, Finding, Verdict, counts
from upsguard.journal.rows import iso, parse_iso
from upsguard.selftest import TestState


def write_checkup(db: sqlite3.Connection, event: CheckupDone) -> None:
    n = counts(event.findings)
    cursor = db.execute(
        "INSERT INTO checkups (at, took, ok, warn, fail) VALUES (?, ?, ?, ?, ?)",
        (iso(event.at), event.took_s, n[Verdict.OK], n[Verdict.WARN], n[Verdict.FAIL]),
    )
    broke = {f.key for f in event.broke}
    db.executemany(
        "INSERT INTO checks (checkup, area, subject, name, verdict, detail, fix, missing, adds,"
        " took, broke) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                cursor.lastrowid,
                f.area.value,
                f.subject,
                f.check,
                f.verdict.value,
                f.detail,
                f.fix,
                json.dumps(list(f.missing)) if f.missing else None,
                f.adds_s,
                f.took_s,
                int(f.key in broke),
            )
            for f in event.findings
        ],
    )


def last_checkup(db: sqlite3.Connection) -> tuple[datetime, list[Finding]] | None:
    """When the newest checkup ran and what it found; None before the first."""
    row = db.execute("SELECT id, at FROM checkups ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return None
    found = db.execute(
        "SELECT area, subject, name, verdict, detail, fix, missing, adds, took FROM checks"
        " WHERE checkup = ? ORDER BY id",
        (row[0],),
    ).fetchall()
    return parse_iso(row[1]), [
        Finding(
            Area(r[0]),
            r[1],
            r[2],
            Verdict(r[3]),
            r[4],
            r[5],
            tuple(json.loads(r[6])) if r[6] else (),
            r[7],
            r[8],
        )
        for r in found
    ]


def write_battery_test(db: sqlite3.Connection, event: BatteryTestFinished) -> None:
    db.execute(
        "INSERT INTO battery_tests (ups, kind, started, ended, state, text, charge_start,"
        " charge_end, runtime_observed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            event.ups,
            event.test,
            iso(event.started),
            iso(event.at),
            event.state.value,
            event.text,
            event.charge_start,
            event.charge_end,
            event.runtime_observed_s,
        ),
    )


@dataclass(frozen=True, slots=True)
class BatteryTestRow:
    ups: str
    kind: str
    started: datetime
    ended: datetime
    state: TestState
    text: str
    charge_start: float | None
    charge_end: float | None
    runtime_observed_s: float | None


def battery_tests(
    db: sqlite3.Connection, ups: str | None = None, limit: int = 20
) -> list[BatteryTestRow]:
    """The newest battery tests first (of one UPS, or of all)."""
    where, args = ("WHERE ups = ?", [ups]) if ups else ("", [])
    rows = db.execute(
        "SELECT ups, kind, started, ended, state, text, charge_start, charge_end,"
        f" runtime_observed FROM battery_tests {where} ORDER BY id DESC LIMIT ?",
        (*args, limit),
    ).fetchall()
    return [
        BatteryTestRow(
            r[0], r[1], parse_iso(r[2]), parse_iso(r[3]), TestState(r[4]), r[5], r[6], r[7], r[8]
        )
        for r in rows
    ]
