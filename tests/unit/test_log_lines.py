"""The service's log in the journal's form (``cli.logs``): each line of a record, a
traceback's too, carries the record's priority, since the journal reads each line as an
entry of its own (a traceback's lines were entries of priority info under an error)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from upsguard.cli.logs import handler


def test_every_line_of_an_error_with_its_traceback_carries_its_priority(tmp_path: Path) -> None:
    path = tmp_path / "stderr"
    with path.open("w") as stream:
        info = os.fstat(stream.fileno())
        out = handler(stream, {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"})
        logger = logging.Logger("upsguard.test")
        logger.addHandler(out)
        try:
            raise RuntimeError("a plugin's bug")
        except RuntimeError:
            logger.exception("poll failed")
        logger.warning("ups1: answering again")
    lines = path.read_text().splitlines()
    assert lines[0] == "<3>upsguard.test: poll failed"
    assert lines[1] == "<3>Traceback (most recent call last):"
    assert lines[-2] == "<3>RuntimeError: a plugin's bug"
    assert lines[-1] == "<4>upsguard.test: ups1: answering again"
    assert all(line.startswith("<3>") for line in lines[:-1])
