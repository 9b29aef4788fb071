"""The journal is a record, not a precondition: a corrupt, full or read-only journal is an
alert, never a reason to stop watching or acting."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.faults.lab import Lab
from tests.peers.service import ServiceProcess
from upsguard.events import OverrideApplied

pytestmark = [pytest.mark.nut, pytest.mark.timeout(240)]


class Disk:
    """A small tmpfs of the test's own, to fill up or make read-only (needs root)."""

    def __init__(self, path: Path, size: str = "2m") -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs for the journal (needs root): {done.stderr}")

    def remount(self, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(self.path)], check=True)

    def fill(self) -> None:
        """Fill every free byte, so SQLite cannot grow its files."""
        block = b"\0" * 4096
        with (self.path / "filler").open("wb", buffering=0) as out:
            try:
                while out.write(block):
                    pass
            except OSError:  # no space left: full
                pass

    def free(self) -> None:
        (self.path / "filler").unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path / "disk")
    yield d
    d.unmount()


def valid_journal(tmp: Path) -> bytes:
    """The bytes of a journal a service wrote."""
    from upsguard.journal import Journal

    j = Journal(tmp / "scratch.sqlite")
    j.close()
    return (tmp / "scratch.sqlite").read_bytes()


def corrupt(kind: str, path: Path, tmp: Path) -> None:
    good = valid_journal(tmp)
    if kind == "garbage":
        path.write_bytes(b"this is not a database\n" * 200)
    elif kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "header-only":
        path.write_bytes(good[:100])
    elif kind == "newer-schema":
        path.write_bytes(good)
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 999")
        db.commit()
        db.close()


@pytest.mark.parametrize("kind", ["garbage", "truncated", "header-only", "newer-schema"])
def test_a_corrupt_journal_is_moved_aside_and_the_service_acts(
    kind: str, lab: Lab, tmp_path: Path
) -> None:
    svc = lab.service(tmp_path)
    corrupt(kind, svc.journal, tmp_path)
    try:
        svc.start()
        lab.outage()
        lab.wait_all_off(svc)
        # the last device off comes before the run's end is journaled: wait for it, or the
        # kill below would race it
        svc.wait(lambda: svc.status()["phase"] == "down", "the run to finish")
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        log = svc.log.read_text()
        aside = sorted(p.name for p in svc.journal.parent.glob("journal.sqlite.*"))
        assert any(name.startswith("journal.sqlite.bad-") for name in aside), aside
        assert "moved aside" in log and "Traceback" not in log
    finally:
        svc.stop()
    journal = svc.read_journal()
    (run,) = journal.read.runs()
    assert (run.kind, run.state) == ("shutdown", "done")
    journal.close()


def test_a_full_disk_is_an_alert_overrides_still_answer_and_the_journal_catches_up(
    lab: Lab, tmp_path: Path, disk: Disk
) -> None:
    svc = lab.service(tmp_path, journal=str(disk.path / "journal.sqlite"))
    try:
        svc.start()
        disk.fill()
        assert "held: generator test" in svc.cli("hold", "--reason", "generator test").stdout
        svc.cli("release", "--reason", "test over")
        out = svc.cli("trigger", "shutdown", "--yes", "--reason", "disk full drill").stdout
        assert "started run shutdown-" in out
        lab.wait_all_off(svc)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down")
        st = svc.status()
        assert "journal" in " ".join(a["text"] for a in st.get("alerts", []))
        disk.free()
        svc.wait(lambda: _overrides(svc) >= 3, "the journal to catch up once there is room")
        assert "Traceback" not in svc.log.read_text()
    finally:
        svc.stop()


def test_a_read_only_journal_is_an_alert_and_the_service_acts(
    lab: Lab, tmp_path: Path, disk: Disk
) -> None:
    svc = lab.service(tmp_path, journal=str(disk.path / "journal.sqlite"))
    svc.start()
    assert svc.terminate() == 0
    disk.remount("ro")
    try:
        svc.start()
        lab.outage()
        lab.wait_all_off(svc)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        assert "keeping records in memory" in svc.log.read_text()
        assert "Traceback" not in svc.log.read_text()
    finally:
        svc.stop()


def test_a_restart_on_a_full_disk_after_kill_9_finishes_the_run(
    lab: Lab, tmp_path: Path, disk: Disk
) -> None:
    svc = lab.service(tmp_path, journal=str(disk.path / "journal.sqlite"))
    lab.hold("db")
    try:
        svc.start()
        lab.outage()
        svc.wait(lambda: lab.begun("db"), "db's stop to begin")
        svc.kill9()
        disk.fill()
        lab.release("db")
        svc.start()
        lab.wait_all_off(svc)
        assert lab.order_violations() == []
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        assert "Traceback" not in svc.log.read_text()
    finally:
        svc.stop()


def _overrides(svc: ServiceProcess) -> int:
    try:
        db = sqlite3.connect(f"file:{svc.journal}?mode=ro", uri=True)
        try:
            (count,) = db.execute("SELECT COUNT(*) FROM overrides").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return 0
    return int(count)


def test_a_retry_while_the_disk_is_still_full_keeps_what_waits_and_writes_it_later(
    disk: Disk,
) -> None:
    """The journal's retry (every 15 s) came while the disk was still full: its writes went
    through, its commit did not, and the journal went on writing to the full file instead of
    memory. What a person did meanwhile was never read back, and the full lane's disk test
    failed when a retry fell in the window (the busier the machine, the wider it is). And
    the copy in memory was made from the file as it lies, without what was still in its
    write-ahead log: the last hold before the disk filled was missing from it."""
    from upsguard.journal import Journal

    def override(action: str) -> OverrideApplied:
        return OverrideApplied(datetime.now(UTC), "ana", action, "generator test")

    journal = Journal(disk.path / "journal.sqlite", repair=True)
    try:
        journal.write.record(override("hold"))
        disk.fill()
        journal.write.record(override("release"))
        assert journal.retry() is False  # still full
        journal.write.record(override("trigger"))
        assert [o.action for o in journal.read.overrides()] == ["trigger", "release", "hold"]
        disk.free()
        assert journal.retry() is True
    finally:
        journal.close()
    reopened = Journal(disk.path / "journal.sqlite")
    try:
        assert [o.action for o in reopened.read.overrides()] == ["trigger", "release", "hold"]
    finally:
        reopened.close()
