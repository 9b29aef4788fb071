"""Processes a step started here, found again after the controller that started them died.

A step's command runs in a session of its own (a stop signal meant for the service must not
kill it halfway), so it outlives the controller; and its exit status dies with the parent
that started it. So the command's own session writes its exit status to a file
(``WRAPPER``), and a process is named by its PID and its start time (field 22 of
``/proc/PID/stat``): a PID the kernel gave to another process since has another start time.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from upsguard.models import CommandProcess

__all__ = ["NOT_STARTED", "WRAPPER", "exit_status", "identify", "running"]

NOT_STARTED = "not started"
"""What the exit-status file says when the controller died before it let the command run."""

WRAPPER = (
    'if ! IFS= read -r go || [ "$go" != go ]; then echo "not started" > "$0"; exit 111; fi; '
    '"$@" < /dev/null; rc=$?; echo "$rc" > "$0.tmp" && mv -f "$0.tmp" "$0"; exit "$rc"'
)
"""``sh -c WRAPPER EXIT_FILE ARGV...``: waits for ``go`` on its input (sent once the process
is journaled: a command is never running unjournaled), runs ARGV, then writes its exit
status to EXIT_FILE (whole, by a rename). Input closed without ``go``: nothing runs, and the
file says so."""


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 (state) on; None when there is no such process. The
    command's name (field 2) may hold spaces and parentheses: split after the last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def identify(pid: int) -> tuple[int, int] | None:
    """The start time (clock ticks after boot) and session id of process ``pid``; None when
    it is gone."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19]), int(fields[3])


def running(process: CommandProcess) -> bool:
    """Whether ``process`` itself still runs: its PID is there, with the same start time (not
    a reused PID), and it is not a zombie waiting for its parent."""
    fields = _stat_fields(process.pid)
    if fields is None or len(fields) < 20:
        return False
    return fields[0] != "Z" and int(fields[19]) == process.start_ticks


def exit_status(process: CommandProcess) -> int | str | None:
    """What the process's exit-status file says: its command's exit status, ``NOT_STARTED``,
    or None when there is no file (it still runs, or its session was killed too)."""
    try:
        text = Path(process.exit_file).read_text().strip()
    except OSError:
        return None
    if text == NOT_STARTED:
        return NOT_STARTED
    with contextlib.suppress(ValueError):
        return int(text)
    return None
