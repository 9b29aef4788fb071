"""The journal's tables, and the migrations that take an older journal to the current schema.

The schema version lives in SQLite's ``user_version``; migration N takes a
journal from version N to N + 1. A journal newer than this build is refused
rather than misread.
"""

from __future__ import annotations

import sqlite3

from upsguard.errors import PermanentError

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: the first schema
    """
    CREATE TABLE readings (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        ups TEXT NOT NULL,
        status TEXT NOT NULL,
        charge REAL,
        runtime REAL,
        load REAL,
        input_voltage REAL,
        link TEXT NOT NULL
    );
    CREATE INDEX readings_at ON readings(at);
    CREATE TABLE phases (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        old TEXT NOT NULL,
        new TEXT NOT NULL,
        reason TEXT NOT NULL
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        direction TEXT NOT NULL,
        kind TEXT NOT NULL,
        origin TEXT NOT NULL,
        only TEXT,
        reason TEXT NOT NULL,
        started TEXT NOT NULL,
        ended TEXT,
        state TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT '',
        point_of_no_return TEXT,
        resumed INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE steps (
        id INTEGER PRIMARY KEY,
        run TEXT NOT NULL REFERENCES runs(id),
        step TEXT NOT NULL,
        action TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        started TEXT NOT NULL,
        ended TEXT,
        state TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT '',
        tries INTEGER NOT NULL DEFAULT 1,
        fallback_used INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX steps_run ON steps(run, step);
    CREATE TABLE cache_ops (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        cache TEXT NOT NULL,
        target TEXT NOT NULL,
        mode TEXT NOT NULL,
        ok INTEGER NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE overrides (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        who TEXT NOT NULL,
        action TEXT NOT NULL,
        reason TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        level TEXT NOT NULL,
        text TEXT NOT NULL,
        run TEXT
    );
    """,
    # 1 -> 2: the feeds an outage run is for (JSON list; NULL: every feed)
    """
    ALTER TABLE runs ADD COLUMN feeds TEXT;
    """,
    # 2 -> 3: the service's scheduled checks (one row per finding) and battery tests
    """
    CREATE TABLE checkups (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        took REAL NOT NULL,
        ok INTEGER NOT NULL,
        warn INTEGER NOT NULL,
        fail INTEGER NOT NULL
    );
    CREATE TABLE checks (
        id INTEGER PRIMARY KEY,
        checkup INTEGER NOT NULL REFERENCES checkups(id),
        area TEXT NOT NULL,
        subject TEXT NOT NULL,
        name TEXT NOT NULL,
        verdict TEXT NOT NULL,
        detail TEXT NOT NULL,
        fix TEXT NOT NULL DEFAULT '',
        missing TEXT,
        adds REAL,
        took REAL,
        broke INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX checks_checkup ON checks(checkup);
    CREATE TABLE battery_tests (
        id INTEGER PRIMARY KEY,
        ups TEXT NOT NULL,
        kind TEXT NOT NULL,
        started TEXT NOT NULL,
        ended TEXT NOT NULL,
        state TEXT NOT NULL,
        text TEXT NOT NULL DEFAULT '',
        charge_start REAL,
        charge_end REAL,
        runtime_observed REAL
    );
    """,
    # 3 -> 4: facts the engine reads back after a restart, as typed columns: a step's
    # resource and whether it found its targets there already; what upsguard owes a cache
    # (taken out of write-back); the requests platforms accepted (never asked twice). Old
    # rows of steps get their resource from their id (``stop:web/web-01`` is web's) and
    # "already there" from the words the old engine wrote: read once, here, never again.
    """
    ALTER TABLE steps ADD COLUMN resource TEXT;
    ALTER TABLE steps ADD COLUMN already_there INTEGER NOT NULL DEFAULT 0;
    UPDATE steps SET resource = CASE
        WHEN instr(substr(step, instr(step, ':') + 1), '/') > 0
        THEN substr(substr(step, instr(step, ':') + 1), 1,
                    instr(substr(step, instr(step, ':') + 1), '/') - 1)
        ELSE substr(step, instr(step, ':') + 1) END;
    UPDATE steps SET already_there = 1
        WHERE state = 'done' AND (detail LIKE '% already off' OR detail LIKE '% already up');
    ALTER TABLE cache_ops ADD COLUMN owed INTEGER NOT NULL DEFAULT 0;
    UPDATE cache_ops SET owed = 1 WHERE ok = 1 AND mode = 'write-through';
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        run TEXT NOT NULL,
        step TEXT NOT NULL,
        platform TEXT NOT NULL,
        target TEXT NOT NULL,
        target_kind TEXT NOT NULL,
        wanted TEXT NOT NULL
    );
    CREATE INDEX requests_run ON requests(run);
    """,
    # 4 -> 5: each event's typed fields as JSON (``journal.payload``), what reports and
    # learned figures read instead of the line of text. Events journaled before keep no
    # payload (NULL): their facts are not read back out of their words. Whether a step acted
    # on one member of a group, as a column; old rows get it from their id (``stop:web/web-01``
    # names a member of web): read once, here, never again.
    """
    ALTER TABLE events ADD COLUMN payload TEXT;
    ALTER TABLE steps ADD COLUMN member INTEGER NOT NULL DEFAULT 0;
    UPDATE steps SET member = 1
        WHERE resource IS NOT NULL AND substr(step, instr(step, ':') + 1) != resource;
    """,
    # 5 -> 6: a request that is a command running here (the ``command`` platform) names its
    # process, journaled as it starts: PID, start time (``/proc/PID/stat`` field 22, so a
    # reused PID is not taken for it), session, and the file its exit status goes to. A
    # restarted controller waits for that process instead of starting the command again.
    """
    ALTER TABLE requests ADD COLUMN pid INTEGER;
    ALTER TABLE requests ADD COLUMN pid_start INTEGER;
    ALTER TABLE requests ADD COLUMN session INTEGER;
    ALTER TABLE requests ADD COLUMN exit_file TEXT;
    """,
    # 6 -> 7: a command sent to a target that ran and failed (``RequestFailed``) is no
    # request under way: a restarted controller does not wait for it to land.
    """
    ALTER TABLE requests ADD COLUMN failed INTEGER NOT NULL DEFAULT 0;
    """,
)

VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, path: str) -> int:
    """Bring the journal to ``VERSION``; returns the version it had."""
    (found,) = db.execute("PRAGMA user_version").fetchone()
    if found > VERSION:
        raise PermanentError(
            f"journal {path}: schema {found} is newer than this upsguard knows ({VERSION}): "
            "upgrade upsguard or point 'journal:' at another file"
        )
    for version in range(found, VERSION):
        with db:
            script = MIGRATIONS[version] + f"PRAGMA user_version = {version + 1};"
            db.executescript("BEGIN;" + script)
    return int(found)
