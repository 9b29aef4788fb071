"""Waiting for a peer process the tests started: ready, or the test fails with its log."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


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
