"""Runs of a runbook: their kinds, origins and outcomes, and what the phase engine reads of them.

The life of a run::

    started --> (point of no return) --> DONE | FAILED        it ran to its end
                                     --> CANCELLED            power back before the point of
                                                              no return
                                     --> ABORTED              a person cancelled it
                                     --> INTERRUPTED          the service stopped; resumed at
                                                              its next start
                                     --> ABANDONED            superseded by a newer run, or
                                                              closed while nobody could resume it

``engine.ledger.RunLedger`` owns every run's record and is the only writer; everything
else (the phase engine, status, metrics, the journal) reads records or the events the
ledger emits. A record is frozen: each change of a run is a new record.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from upsguard.models import Direction, ResourceId, RunId, StepId


class RunKind(enum.StrEnum):
    """What a run does."""

    SHUTDOWN = "shutdown"
    """The shutdown runbook: the whole site, or (with ``only``) some resources and what must
    stop before them."""
    SHEDDING = "shedding"
    """The resources marked ``shed: true``, stopped early on battery to stretch the runtime."""
    STARTUP = "startup"
    """The startup runbook, the mirror of the shutdown."""

    @property
    def direction(self) -> Direction:
        return Direction.STARTUP if self is RunKind.STARTUP else Direction.SHUTDOWN


class RunOrigin(enum.StrEnum):
    """Who asked for a run."""

    POLICY = "policy"
    """The phase engine, from the readings and the site file's policies."""
    MANUAL = "manual"
    """A person: ``upsguard trigger`` over the local API, or from the CLI directly."""


class RunOutcome(enum.StrEnum):
    """How a run ended; a run in progress has none yet."""

    DONE = "done"
    """Every step ended done or skipped."""
    FAILED = "failed"
    """It ran to its end and some step failed."""
    CANCELLED = "cancelled"
    """Power came back before the point of no return, or the phase engine stopped it."""
    ABORTED = "aborted"
    """A person cancelled it (``upsguard abort``)."""
    INTERRUPTED = "interrupted"
    """The service stopped while it ran; the next start resumes it."""
    ABANDONED = "abandoned"
    """Superseded by a newer run, or closed while nobody could resume it."""

    @property
    def resumable(self) -> bool:
        return self is RunOutcome.INTERRUPTED


class RunState(enum.StrEnum):
    """Where a run stands as the journal keeps it (its ``state`` column): ``running``, or
    one of the ``RunOutcome`` members, which document themselves. A separate enum because
    the journal must name the state of a run that has no outcome yet, and a dead process
    leaves its run ``running`` until the next start reaps it."""

    RUNNING = "running"
    """Started and not ended, or left so by a process that died."""
    DONE = RunOutcome.DONE.value
    FAILED = RunOutcome.FAILED.value
    CANCELLED = RunOutcome.CANCELLED.value
    ABORTED = RunOutcome.ABORTED.value
    INTERRUPTED = RunOutcome.INTERRUPTED.value
    ABANDONED = RunOutcome.ABANDONED.value

    @property
    def outcome(self) -> RunOutcome | None:
        """How the run ended; None while it runs."""
        return None if self is RunState.RUNNING else RunOutcome(self.value)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a run is: enough to start it again after a crash."""

    id: RunId
    kind: RunKind
    origin: RunOrigin
    reason: str
    at: datetime
    only: tuple[ResourceId, ...] | None = None
    """The resources the run is limited to (and what must stop before them); None: all."""
    feeds: tuple[str, ...] | None = None
    """The feeds an outage run is for (what they power is ``only``); None: every feed."""

    @property
    def direction(self) -> Direction:
        return self.kind.direction

    @property
    def concerns_the_site(self) -> bool:
        """A whole-site run, or one a policy started for some feeds; a partial manual run
        says nothing about the site's outage."""
        return self.only is None or self.origin is RunOrigin.POLICY


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as the ledger knows it now."""

    spec: RunSpec
    outcome: RunOutcome | None = None
    point_of_no_return: StepId | None = None
    detail: str = ""
    ended: datetime | None = None

    @property
    def active(self) -> bool:
        return self.outcome is None


@dataclass(frozen=True, slots=True)
class SiteRuns:
    """What the phase engine needs to know about runs, derived from the newest run that
    concerns the whole site (``latest``) and the run in progress (``active``)."""

    latest: RunRecord | None = None
    active: RunRecord | None = None

    @classmethod
    def of(cls, newest_first: Iterable[RunRecord]) -> SiteRuns:
        latest = active = None
        for record in newest_first:
            if active is None and record.active:
                active = record
            if latest is None and record.spec.concerns_the_site:
                latest = record
            if latest is not None and active is not None:
                break
        return cls(latest, active)

    def _latest_is(self, kind: RunKind) -> bool:
        return self.latest is not None and self.latest.spec.kind is kind

    @property
    def shutdown_running(self) -> bool:
        """The site's shutdown (of every feed, or of the feeds at risk) is in progress."""
        a = self.active
        return a is not None and a.spec.kind is RunKind.SHUTDOWN and a.spec.concerns_the_site

    @property
    def shutdown_feeds(self) -> tuple[str, ...] | None:
        """The feeds the latest shutdown is for: None for every feed, () for no shutdown."""
        if not self._latest_is(RunKind.SHUTDOWN) or self.latest is None:
            return ()
        return self.latest.spec.feeds

    @property
    def startup_running(self) -> bool:
        return self.active is not None and self.active.spec.kind is RunKind.STARTUP

    @property
    def shutdown_manual(self) -> bool:
        """A person shut the site down: power returning does not cancel it, and the site
        stays down until a person starts it."""
        latest = self.latest
        return self._latest_is(RunKind.SHUTDOWN) and (
            latest is not None and latest.spec.origin is RunOrigin.MANUAL
        )

    @property
    def point_of_no_return(self) -> bool:
        return self._latest_is(RunKind.SHUTDOWN) and (
            self.latest is not None and self.latest.point_of_no_return is not None
        )

    @property
    def shutdown_finished(self) -> bool:
        return self._latest_is(RunKind.SHUTDOWN) and self._outcome_in(
            RunOutcome.DONE, RunOutcome.FAILED
        )

    @property
    def cancelled_before_ponr(self) -> bool:
        """The shutdown was called off before any host or storage went down."""
        return (
            self._latest_is(RunKind.SHUTDOWN)
            and self._outcome_in(RunOutcome.CANCELLED, RunOutcome.ABORTED)
            and not self.point_of_no_return
        )

    @property
    def startup_finished(self) -> bool:
        return self._latest_is(RunKind.STARTUP) and self._outcome_in(RunOutcome.DONE)

    @property
    def startup_failed(self) -> bool:
        """The automatic startup ended with failed steps: the site stays recovering (caches
        write-through) until a person runs the startup again; it is not retried in a loop."""
        return self._latest_is(RunKind.STARTUP) and self._outcome_in(RunOutcome.FAILED)

    @property
    def something_stopped(self) -> bool:
        """Something was stopped since the site last started up in full."""
        return self.latest is not None and not self.startup_finished

    def _outcome_in(self, *outcomes: RunOutcome) -> bool:
        return self.latest is not None and self.latest.outcome in outcomes
