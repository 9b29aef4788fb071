"""What a retrospective tells, as plain values: a neutral model that the journal (a real run)
and the simulator (a dry run) both fill, and that one renderer draws.

Times are seconds from the story's ``origin`` (the mains failure, else the start of the
outage, or of the first run when there was no outage), so a real run and a simulated one
read the same; the origin itself is an absolute time (UTC), and so is every time a report
prints beside its T+.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from upsguard.models import Direction, StepState
from upsguard.runs import RunKind, RunOrigin, RunState


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a run as it was recorded (the input side: a journal row, or the events of
    a simulation)."""

    step: str
    action: str
    started: datetime | None
    ended: datetime | None
    state: StepState
    detail: str
    tries: int = 1
    fallback_used: bool = False
    resource: str | None = None
    """The resource the step acted on (a group's members name their group); None where the
    record does not say."""


@dataclass(frozen=True, slots=True)
class RunFacts:
    """One run as it was recorded."""

    id: str
    kind: RunKind
    direction: Direction
    origin: RunOrigin
    reason: str
    started: datetime
    ended: datetime | None
    state: RunState
    detail: str = ""
    only: tuple[str, ...] | None = None
    point_of_no_return: str | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """A slow, failed or fallback step, and what a person could do about it."""

    step: str
    kind: str  # slow | failed | fallback
    text: str
    suggestion: str


@dataclass(frozen=True, slots=True)
class StepStory:
    """One step, planned against actual. Times in seconds from the story's origin."""

    id: str
    resource: str
    action: str
    description: str
    waits_for: tuple[str, ...]
    state: StepState | None
    """How its last attempt ended; None: it did not run (no row in the journal)."""
    detail: str = ""
    planned_start_s: float | None = None
    planned_s: float | None = None
    estimate_source: str = ""
    start_s: float | None = None
    actual_s: float | None = None
    tries: int = 1
    fallback_used: bool = False
    critical: bool = False
    """On the path that decided how long the run took (the planned one when nothing ran)."""
    timeout_s: float | None = None

    @property
    def outcome(self) -> str:
        """The state as a report prints it."""
        return NOT_RUN if self.state is None else self.state.value


NOT_RUN = "not run"
"""What a report says of a planned step that has no record."""


@dataclass(frozen=True, slots=True)
class Difference:
    """A resource the startup did not bring back as it was before the outage."""

    resource: str
    kind: str
    """started: off before the outage (``found_off_by`` read it off) and running now;
    not_back: not known off before, and its startup step did not end done (``detail``)."""
    detail: str = ""
    found_off_by: str | None = None


@dataclass(frozen=True, slots=True)
class WayBack:
    """A startup run's resources against the site before the outage. A resource counts as
    off before only when the shutdown read it off (``journal.as_before``); any other is taken
    to have been running, so one not up now is a difference, never assumed as before."""

    back: tuple[str, ...]
    """Up again, as before the outage."""
    left_off: tuple[str, ...]
    """Off before the outage and left off."""
    differences: tuple[Difference, ...]


@dataclass(frozen=True, slots=True)
class RunStory:
    facts: RunFacts
    start_s: float
    duration_s: float | None
    planned_s: float
    planned_critical_path_s: float
    steps: tuple[StepStory, ...]
    findings: tuple[Finding, ...] = ()
    way_back: WayBack | None = None
    """A startup run only: the site it left against the site before the outage."""

    @property
    def ratio(self) -> float | None:
        """Actual over planned; above 1 the run took longer than its plan said."""
        if self.duration_s is None or self.planned_s <= 0:
            return None
        return self.duration_s / self.planned_s


@dataclass(frozen=True, slots=True)
class Moment:
    """A phase change, an override, a risk taken, a trigger point, a run's end, a UPS
    command, the mains failing or coming back."""

    at_s: float
    kind: str
    """phase, override, risk, trigger, run (its end), command, command_failed (a UPS
    command), mains_failed, mains_back."""
    text: str
    who: str = ""
    why: str = ""


@dataclass(frozen=True, slots=True)
class UpsCommand:
    """An instant command upsguard sent a UPS, and what the UPS answered: a refused one
    (``CMD-NOT-SUPPORTED``) means the site's way back is not what the site file says."""

    at_s: float
    ups: str
    command: str
    ok: bool
    detail: str = ""
    """The UPS's or the server's answer when it failed."""
    run: str | None = None


@dataclass(frozen=True, slots=True)
class BatterySample:
    ups: str
    at_s: float
    charge_pct: float | None
    runtime_s: float | None
    load_pct: float | None
    on_battery: bool
    model_runtime_s: float | None = None
    """What the site file's battery model (``runtime_at``, Peukert) says for this charge and
    load; None where the load is not known."""


@dataclass(frozen=True, slots=True)
class BatteryFit:
    """Observed runtime against the battery model, for one UPS."""

    ups: str
    samples: int
    ratio: float | None
    """Observed over modelled runtime; below 1 the battery lasts less than the model says."""
    basis: str
    """What the ratio was measured on (the discharge, or the UPS's own runtime figure)."""
    verdict: str
    suggestion: str | None = None
    """A corrected ``runtime_at`` when the UPS lasts measurably less than the model."""


DRAIN_READING = "dirty data read"
"""The note of a cache sample that is only a reading of its dirty bytes (charted, not listed)."""


@dataclass(frozen=True, slots=True)
class CacheSample:
    """A cache's dirty data at one moment (None where only the event is known: a flip, a
    wait) and what happened then."""

    cache: str
    at_s: float
    dirty_bytes: int | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class PlanChange:
    """A step whose next estimate differs from the one the run was planned with."""

    step: str
    before_s: float
    before_source: str
    after_s: float
    after_source: str


@dataclass(frozen=True, slots=True)
class Outlook:
    """What the next outage would look like with the durations learned so far."""

    direction: Direction
    configured_s: float
    learned_s: float
    learned_critical_path: tuple[str, ...]
    learned_critical_path_s: float
    actual_s: float | None
    learned_steps: int = 0
    """How many steps of the next plan have a learned duration (0: nothing learned yet)."""
    changes: tuple[PlanChange, ...] = ()


@dataclass(frozen=True, slots=True)
class Story:
    title: str
    site: str
    source: str  # journal | simulation
    origin: datetime
    runs: tuple[RunStory, ...]
    moments: tuple[Moment, ...] = ()
    battery: tuple[BatterySample, ...] = ()
    battery_fits: tuple[BatteryFit, ...] = ()
    caches: tuple[CacheSample, ...] = ()
    ups_commands: tuple[UpsCommand, ...] = ()
    outlook: tuple[Outlook, ...] = ()
    verdict: str = ""
    mains_failed: datetime | None = None
    """When the mains failed (the story's origin then); None for a drill, a manual run."""
    mains_back: datetime | None = None
    """When the mains came back for good; None when they did not within the story."""
    notes: tuple[str, ...] = field(default=())

    def kind(self, kind: str) -> list[Moment]:
        return [m for m in self.moments if m.kind == kind]
