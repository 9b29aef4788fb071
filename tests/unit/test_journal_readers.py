"""The commands that only read the journal never change it. The journal is the service's:
a newer upsguard's ``plan`` or ``report`` (a checkout beside the package, or the package's
new files before the service restarts) that migrated it would leave the older service, at
its next start, with a journal of a schema it does not know, which it moves aside with the
runs it would resume.

Defect this reproduces (it failed before its fix): ``plan``, ``simulate``, ``report`` and
``history`` migrated a journal of the schema before to this upsguard's; in the full lanes a
unit test's ``simulate`` of the homelab example migrated the journal the package test's
older upsguard was writing at the same path ('assert 7 > 7')."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from tests.sites import EXAMPLES
from upsguard.cli import main
from upsguard.journal.schema import MIGRATIONS, VERSION


def older_journal(path: Path) -> None:
    """A journal as the upsguard before the last migration left it."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        for version, script in enumerate(MIGRATIONS[:-1]):
            db.executescript(f"BEGIN; {script} PRAGMA user_version = {version + 1}; COMMIT;")


def schema_of(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
    return int(version)


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "shutdown", "--durations", "learned"],
        ["simulate", "--scenario", str(EXAMPLES / "scenarios" / "lost-contact.yaml")],
        ["report"],
        ["history"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_read_command_leaves_an_older_journal_at_its_schema(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "homelab.sqlite"
    older_journal(journal)
    site = tmp_path / "homelab.yaml"
    text = (EXAMPLES / "homelab.yaml").read_text()
    site.write_text(text.replace("/var/lib/upsguard/homelab.sqlite", str(journal), 1))

    code = main([*command, "-c", str(site)])

    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code in (0, 1), err  # report and history: nothing to show yet, said in one line
    assert schema_of(journal) == VERSION - 1
