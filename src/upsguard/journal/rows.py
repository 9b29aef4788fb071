"""What the journal stores, as its own row types: plain values, times as UTC ISO-8601 text.

These are not the in-memory models (``UpsReading``, ``StepOutcome``): a row is
what was written at the time, read back for ``history``, ``status`` and resume.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from upsguard.models import (
    CacheMode,
    Direction,
    LinkState,
    Phase,
    ResourceId,
    RunId,
    StepId,
    StepState,
)
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunRecord, RunSpec, RunState


def iso(at: datetime) -> str:
    """UTC ISO-8601 with milliseconds and a Z, the one time format of the journal."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class Row:
    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload,no-any-return]


@dataclass(frozen=True, slots=True)
class ReadingRow(Row):
    at: str
    ups: str
    status: str
    charge: float | None
    runtime: float | None
    load: float | None
    input_voltage: float | None
    link: LinkState


@dataclass(frozen=True, slots=True)
class PhaseRow(Row):
    at: str
    old: Phase
    new: Phase
    reason: str


@dataclass(frozen=True, slots=True)
class StepRow(Row):
    run: str
    step: str
    action: str
    attempt: int
    started: str
    ended: str | None
    state: StepState
    """The attempt's state; one row per attempt (``StepState`` documents each)."""
    detail: str
    tries: int
    fallback_used: bool
    resource: str | None = None
    """The resource the step acts on (a group's members name their group)."""
    already_there: bool = False
    """Every target was in the wanted state already: nothing was asked."""
    member: bool = False
    """One VM of a group expanded from live inventory, not the whole resource."""

    @property
    def ran(self) -> bool:
        """Started on its targets (a row of a step that never started says why: skipped,
        cancelled, a barrier passed)."""
        return self.action != NEVER_STARTED


NEVER_STARTED: Final = "-"
"""The ``action`` of a step row written for a step that never started."""


@dataclass(frozen=True, slots=True)
class RunRow(Row):
    id: str
    direction: Direction
    kind: RunKind
    origin: RunOrigin
    only: tuple[str, ...] | None
    reason: str
    started: str
    ended: str | None
    state: RunState
    """``running``, or how the run ended (``RunState`` documents each)."""
    detail: str
    point_of_no_return: str | None
    resumed: int
    feeds: tuple[str, ...] | None = None
    steps: tuple[StepRow, ...] = field(default=())

    @property
    def outcome(self) -> RunOutcome | None:
        """How the run ended; None while it is running (or a dead process left it so)."""
        return self.state.outcome

    @property
    def unfinished(self) -> bool:
        """Running, or interrupted: the next start of the service resumes it."""
        return self.outcome is None or self.outcome.resumable

    def record(self) -> RunRecord:
        """The run as the run ledger holds it; a run still 'running' in the journal was left
        by a process that died and is active until resumed or closed."""
        spec = RunSpec(
            id=RunId(self.id),
            kind=self.kind,
            origin=self.origin,
            reason=self.reason,
            at=parse_iso(self.started),
            only=tuple(ResourceId(r) for r in self.only) if self.only is not None else None,
            feeds=self.feeds,
        )
        return RunRecord(
            spec,
            outcome=self.outcome,
            point_of_no_return=StepId(self.point_of_no_return) if self.point_of_no_return else None,
            detail=self.detail,
            ended=parse_iso(self.ended) if self.ended else None,
        )

    @staticmethod
    def list_text(only: tuple[str, ...] | None) -> str | None:
        return None if only is None else json.dumps(list(only))

    @staticmethod
    def list_of(text: str | None) -> tuple[str, ...] | None:
        return None if text is None else tuple(json.loads(text))


@dataclass(frozen=True, slots=True)
class CacheOpRow(Row):
    at: str
    cache: str
    target: str
    mode: CacheMode
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class RequestRow(Row):
    """A request a platform accepted for one target of a step."""

    at: str
    run: str
    step: str
    platform: str
    target: str
    target_kind: str
    wanted: str
    pid: int | None = None
    """The command's process, when the request is a command running here (with
    ``pid_start``, ``session`` and ``exit_file``; its start is ``at``)."""
    pid_start: int | None = None
    session: int | None = None
    exit_file: str | None = None


@dataclass(frozen=True, slots=True)
class OverrideRow(Row):
    at: str
    who: str
    action: str  # hold | release | trigger | abort | resume
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class EventRow(Row):
    id: int
    at: str
    kind: str
    level: str
    text: str
    """The line a person reads (``events.describe``); never parsed."""
    run: str | None
    payload: dict[str, Any] | None = None
    """The event's typed fields (``journal.payload``); None for an event journaled before
    schema 5."""
