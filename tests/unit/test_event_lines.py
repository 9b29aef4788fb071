"""The line a person reads for an event (``events.describe``): no dangling colon where a
detail is empty."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from upsguard.events import (
    CacheClean,
    Event,
    PhaseChanged,
    RunFinished,
    StepFinished,
    StepWaiting,
    describe,
)
from upsguard.models import Phase, RunId, StepId, StepState
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
R1 = RunId("r1")
APP = StepId("stop:app")
SPEC = RunSpec(R1, RunKind.SHUTDOWN, RunOrigin.POLICY, "low battery", AT)


@pytest.mark.parametrize(
    ("event", "line"),
    [
        (StepFinished(AT, R1, APP, StepState.ABANDONED, ""), "abandoned stop:app"),
        (
            StepFinished(AT, R1, APP, StepState.DONE, "off"),
            "done      stop:app: off",
        ),
        (RunFinished(AT, SPEC, RunOutcome.ABANDONED), "shutdown runbook abandoned"),
        (RunFinished(AT, SPEC, RunOutcome.DONE, "7 done"), "shutdown runbook done: 7 done"),
        (StepWaiting(AT, R1, StepId("stop:h1"), ""), "waiting  stop:h1"),
        (PhaseChanged(AT, Phase.DOWN, Phase.RECOVERING, ""), "phase down -> recovering"),
    ],
)
def test_an_empty_detail_leaves_no_colon(event: Event, line: str) -> None:
    text = describe(event)
    assert text is not None and text.strip() == line and text == text.rstrip()


def test_a_cache_waited_for_says_its_wait_as_every_duration_reads() -> None:
    """Defect this reproduces (it failed before the fix): ``waited 154 s`` beside the
    ``2m34s`` of the lines around it."""
    assert describe(CacheClean(AT, "esx-flash", 154.0)) == "cache esx-flash clean (waited 2m34s)"
    assert describe(CacheClean(AT, "esx-flash", 0.0)) == "cache esx-flash clean (waited 0s)"
