"""One service per journal: an exclusive lock held for the service's life.

Two services on one journal would each resume the other's runs and send every command
twice. The lock is ``flock`` on ``<journal>.lock`` (released by the kernel when the
process dies, so a crash never leaves it held); the file names the holder's PID for the
one-line refusal. Where the journal's directory cannot be written, the lock lives in the
temporary directory under a name derived from the journal's path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

from upsguard.errors import JournalInUse


class JournalLock:
    def __init__(self, journal: str | Path) -> None:
        self.journal = str(journal)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``JournalInUse`` naming the holder."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise JournalInUse(
                f"journal {self.journal} is in use by another upsguard service (pid {holder}): "
                "stop that one first, or give this site a journal of its own"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _open(self) -> int:
        beside = Path(self.journal + ".lock")
        with contextlib.suppress(OSError):
            beside.parent.mkdir(parents=True, exist_ok=True)
            return os.open(beside, os.O_RDWR | os.O_CREAT, 0o600)
        digest = hashlib.sha256(os.path.abspath(self.journal).encode()).hexdigest()[:16]
        elsewhere = Path(tempfile.gettempdir()) / f"upsguard-journal-{digest}.lock"
        return os.open(elsewhere, os.O_RDWR | os.O_CREAT, 0o600)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
