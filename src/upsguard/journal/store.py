"""The journal file: opened, repaired, kept in memory while it cannot be written.

``Journal`` is the file and its connection; what goes in is its ``write``
(``journal.writer.JournalWriter``, the event sink), what comes out its ``read``
(``journal.queries.JournalQueries``). SQLite in WAL mode, written synchronously from the
event loop as events arrive: when the executor's ``StepFinished`` call returns, the row is
on disk, before any dependent step starts. ``synchronous=NORMAL`` in WAL mode survives the
process being killed (``kill -9``); only a power cut of the controller's own machine can
lose the last transactions, and that machine goes down last.

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
from datetime import timedelta
from pathlib import Path

from upsguard.errors import PermanentError
from upsguard.events import Event, ReadingTaken
from upsguard.journal.file import Corrupt, move_aside, open_file, open_to_read, set_access
from upsguard.journal.queries import JournalQueries
from upsguard.journal.rows import parse_iso
from upsguard.journal.schema import migrate
from upsguard.journal.writer import JournalWriter, LineListener

log = logging.getLogger(__name__)


MAX_PENDING = 100_000
"""Events kept in memory while the file cannot be written; past this, readings go first."""

ProblemListener = Callable[[str | None], None]


class Journal:
    def __init__(
        self,
        path: str | Path,
        readings_every: timedelta = timedelta(minutes=1),
        *,
        repair: bool = False,
        read_only: bool = False,
        on_problem: ProblemListener | None = None,
        group_id: int | None = None,
        on_line: LineListener | None = None,
    ) -> None:
        """``repair``: the service's way of opening (see the module docstring); otherwise a
        journal that cannot be opened is a ``PermanentError`` (the CLI's read commands).
        ``read_only``: for a command that only reads an existing journal; the file is left as
        it is, an older schema read through a copy migrated in memory (``open_to_read``).
        ``on_problem`` hears each new problem (and None once it is solved).
        ``group_id``: with ``repair``, the socket group that may read the file.
        ``on_line`` hears each line added to the events table (what ``GET /events`` serves)."""
        self.path = str(path)
        self._on_problem = on_problem
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
                self.db = open_to_read(self.path) if read_only else open_file(self.path)
            except Corrupt as exc:
                raise PermanentError(f"journal {path}: {exc}") from exc
            except (OSError, sqlite3.Error) as exc:
                raise PermanentError(
                    f"journal {path}: cannot open it ({exc}): check the 'journal:' path and the "
                    "permissions of its directory"
                ) from exc
        self.read = JournalQueries(self._connection)
        self.write = JournalWriter(
            self._connection, self.safely, self.read, readings_every, on_line
        )

    def close(self) -> None:
        self.db.close()

    def _connection(self) -> sqlite3.Connection:
        return self.db

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

    def _memory_copy(
        self, problem: str, open_file: sqlite3.Connection | None = None
    ) -> sqlite3.Connection:
        """Go on in memory, starting from what the file holds when it can be read: through
        ``open_file``, the connection that could not write (it also sees what is still in
        the write-ahead log), or else the file as it lies."""
        memory = sqlite3.connect(":memory:")
        with contextlib.suppress(sqlite3.Error):
            if open_file is not None:
                open_file.backup(memory)
            else:
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
        except (OSError, sqlite3.Error, Corrupt):
            return False
        memory, self.db = self.db, db  # the writer writes through ``self.db``
        try:
            with db:  # its commit may fail too (a disk still full): memory goes on then
                for event in self._pending:
                    self.write.apply(event)
        except BaseException as exc:
            self.db = memory
            db.close()
            if isinstance(exc, (OSError, sqlite3.Error, Corrupt)):
                return False
            raise
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

    def safely(self, apply: Callable[[], object], event: Event | None = None) -> None:
        """Apply a write; when the file refuses it, go on in memory and keep the event."""
        try:
            with self.db:
                apply()
        except sqlite3.Error as exc:
            if self._in_memory:
                log.error("journal (in memory): could not record: %s", exc)
                return
            failed = self.db
            self.db = self._memory_copy(f"cannot write {self.path}: {exc}", failed)
            failed.close()
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


__all__ = ["Journal", "parse_iso"]
