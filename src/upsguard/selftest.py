"""A UPS's battery test as upsguard sees it: how it came out, in one typed value.

Each UPS source translates what its UPS says (NUT ``ups.test.result``, UPS-MIB
``upsTestResultsSummary``, PowerNet ``upsAdvTestDiagnosticsResults``) into a
``TestState``; the words the UPS used stay in ``text`` for people.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TestState(enum.StrEnum):
    """Where the last battery test stands, as the UPS reports it."""

    NONE = "none"
    """No test was run since the UPS started (or it keeps no result)."""
    RUNNING = "running"
    PASSED = "passed"
    WARNING = "warning"
    """Done, with a warning (a weak battery, often)."""
    FAILED = "failed"
    """Done, and the battery or the UPS failed it: replace the battery."""
    ABORTED = "aborted"
    """Stopped before its end (by upsguard when the mains failed, or by a person)."""
    UNKNOWN = "unknown"
    """The UPS said something upsguard does not know; ``text`` has it."""

    @property
    def finished(self) -> bool:
        return self not in (TestState.RUNNING, TestState.NONE)


@dataclass(frozen=True, slots=True)
class TestResult:
    state: TestState
    text: str
    """The UPS's own words (``Done and passed``, ``donePass(1)``)."""


def from_nut(text: str) -> TestResult:
    """NUT's ``ups.test.result`` (free text by driver; these words are the drivers')."""
    words = text.lower()
    if not words or "no test" in words:
        state = TestState.NONE
    elif "progress" in words:
        state = TestState.RUNNING
    elif "abort" in words:
        state = TestState.ABORTED
    elif "pass" in words:
        state = TestState.PASSED
    elif "warn" in words:
        state = TestState.WARNING
    elif "error" in words or "fail" in words:
        state = TestState.FAILED
    else:
        state = TestState.UNKNOWN
    return TestResult(state, text)
