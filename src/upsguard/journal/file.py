"""The journal's SQLite file: opening it (created mode 0600, WAL), sharing it with the
socket group (0640), telling a corrupt file from one that cannot be written, and moving a
corrupt one aside."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from upsguard.errors import PermanentError
from upsguard.journal.schema import VERSION, migrate


class Corrupt(Exception):
    """The file is not a journal this upsguard can use: moved aside, not overwritten."""


def open_file(path: str, check: bool = False) -> sqlite3.Connection:
    """Open (creating it, mode 0600) and migrate the journal file; ``check`` also runs
    SQLite's quick check. Raises ``Corrupt`` for a file that is not a usable journal,
    ``OSError`` or ``sqlite3.Error`` for one that cannot be opened or written."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    created = not Path(path).exists()
    db = sqlite3.connect(path, timeout=5.0)
    with _closed_on_error(db, path):
        if created:
            os.chmod(path, 0o600)
        db.execute("PRAGMA busy_timeout = 5000")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        if check:
            (verdict,) = db.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != "ok":
                raise Corrupt(f"the database is damaged ({verdict})")
        migrate(db, path)
    return db


def open_to_read(path: str) -> sqlite3.Connection:
    """Open an existing journal for a command that only reads it, changing nothing in the
    file: the service's journal of an older schema (a newer upsguard's ``report`` beside a
    service not yet restarted) is read through a copy migrated in memory. Migrated in
    place, it would be of a schema the older service does not know, which moves it aside at
    its next start with the runs it would resume. Raises as ``open_file`` does."""
    db = sqlite3.connect(path, timeout=5.0)
    with _closed_on_error(db, path):
        db.execute("PRAGMA busy_timeout = 5000")
        (found,) = db.execute("PRAGMA user_version").fetchone()
        if found >= VERSION:
            migrate(db, path)  # nothing to do at this schema; a newer one is refused
            return db
        memory = sqlite3.connect(":memory:")
        db.backup(memory)
    db.close()
    migrate(memory, path)
    return memory


@contextlib.contextmanager
def _closed_on_error(db: sqlite3.Connection, path: str) -> Iterator[None]:
    """Close ``db`` when opening fails, telling a file that is no usable journal
    (``Corrupt``: not a database, malformed, of a newer schema) from one that cannot be
    opened or written (``sqlite3.OperationalError``, as raised)."""
    try:
        yield
    except sqlite3.OperationalError:
        db.close()
        raise
    except sqlite3.DatabaseError as exc:
        db.close()
        raise Corrupt(str(exc)) from exc
    except PermanentError as exc:
        db.close()
        raise Corrupt(str(exc).removeprefix(f"journal {path}: ")) from exc
    except BaseException:
        db.close()
        raise


def journal_exists(path: str | Path) -> bool:
    """Whether a journal file is at ``path``, for the read commands that have nothing to read
    without one. A path that cannot be looked at (a directory the user may not enter) is a
    ``PermanentError`` saying so, not a missing journal."""
    try:
        return Path(path).exists()
    except OSError as exc:
        raise PermanentError(
            f"journal {path}: cannot look at it ({exc.strerror}): check the permissions of its "
            "directory, or run as a user of the site's socket_group"
        ) from exc


def set_access(path: str, gid: int | None) -> None:
    """0640 and group ``gid`` when the site names a socket group, whose members may read the
    history the API would show them anyway; 0600 otherwise. Set on every service start, so
    a group added or removed later applies to a journal created before. SQLite gives the
    WAL files the database file's mode when it creates them; existing ones are set here."""
    mode = 0o600 if gid is None else 0o640
    for suffix in ("", "-wal", "-shm"):
        name = path + suffix
        if suffix and not Path(name).exists():
            continue
        if gid is not None:
            os.chown(name, -1, gid)
        os.chmod(name, mode)


def move_aside(path: str) -> str:
    """Rename the journal (and its WAL files) out of the way; returns the new name."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = f"{path}.bad-{stamp}"
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path + suffix, aside + suffix)
    return aside
