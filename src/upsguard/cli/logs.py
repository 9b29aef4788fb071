"""Where the log goes and how its lines read.

On a terminal, or in a file, each line says when (``2026-11-28 12:52:34,291 INFO ...``).
Under systemd, with stderr the journal's own stream, the journal stamps each line itself:
a line says its syslog priority instead, as sd-daemon(3) prefixes (``<4>`` a warning), so
``journalctl -p warning`` shows the warnings and worse, in colour.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

TERMINAL = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOURNAL = "%(name)s: %(message)s"


def configure(verbose: int) -> None:
    """The root logger: warnings and worse, more with each ``-v``, to stderr."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, handlers=[handler(sys.stderr)])


def handler(stream: TextIO, environ: Mapping[str, str] | None = None) -> logging.Handler:
    """A handler writing to ``stream``, in the journal's form when it is the journal's."""
    out = logging.StreamHandler(stream)
    journal = to_journal(stream, os.environ if environ is None else environ)
    out.setFormatter(JournalFormatter() if journal else logging.Formatter(TERMINAL))
    return out


def to_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """``stream`` is the journal's: ``JOURNAL_STREAM`` (``device:inode``, systemd.exec(5))
    names this very file. systemd sets it for the whole service, so it alone is not enough:
    a stderr sent elsewhere (``2>file``, a pipe) keeps its lines' times."""
    named = environ.get("JOURNAL_STREAM")
    if not named:
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # closed, or no file at all
        return False
    return named == f"{info.st_dev}:{info.st_ino}"


class JournalFormatter(logging.Formatter):
    """``<N>name: message``, N the record's syslog priority. Every line of a record that
    spans several (a traceback) carries it: the journal reads each line as an entry."""

    def __init__(self) -> None:
        super().__init__(JOURNAL)

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def priority(levelno: int) -> int:
    """syslog's priority of a logging level: 2 crit, 3 err, 4 warning, 6 info, 7 debug."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    return 6 if levelno >= logging.INFO else 7
