"""Starting a peer process with its log, and waiting for it: ready, or the test fails with
its log."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest


def spawn(argv: list[str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its stdout and stderr appended to ``log`` (other ``Popen`` arguments
    as given). The child holds the log open; this process closes its own copy at once."""
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **popen)


def wait_started(
    proc: subprocess.Popen[bytes],
    log: Path,
    ready: Callable[[], bool],
    what: str,
    within: float,
    pause: float = 0.05,
) -> None:
    """Return once ``ready()`` is true; fail with the end of ``log`` if the process exits
    first or ``within`` seconds pass."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited at start: {log.read_text()[-2000:]}")
        if ready():
            return
        time.sleep(pause)
    pytest.fail(f"{what} did not start within {within:g}s: {log.read_text()[-2000:]}")


def end_process(proc: subprocess.Popen[bytes], within: float = 5.0) -> None:
    """SIGTERM, as a service manager stops a daemon; SIGKILL if it has not ended ``within``."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Lines:
    """A child's output (a text pipe), line by line, each waited for with a bound. A bare
    ``readline()`` waits for ever on a child that prints nothing more; here a reader thread
    takes the lines as they come, and the test fails naming what it waited for."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put("")  # the end of the output, as readline() says it

    def next(self, what: str, within: float = 30.0) -> str:
        """The next line; "" once the output has ended."""
        try:
            return self._lines.get(timeout=within)
        except queue.Empty:
            pytest.fail(f"no line of {what} within {within:g}s")
