"""The status of a site: the one contract between the service and whoever watches it.

The local API answers ``GET /status`` with it, ``upsguard status`` prints it, and the web
page draws it. One builder (``controller.status``) makes it, from the running service or,
when none runs, from the journal and one fresh poll of each UPS; both ways fill the same
fields, and ``service.running`` says which way it was made. Fields only a running service
can know (the countdown, the run in progress, the caches' drain) are then empty, never
missing.

It lives with the core models, below every layer, because both sides of the socket read
it: the controller writes it, the CLI and the web page parse it back
(``SiteStatus.model_validate``). Its JSON Schema (``SiteStatus.model_json_schema()``) is
what the API's tests validate answers against; adding a field is compatible, renaming
one is not.
"""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from upsguard.models import Direction, LinkState, Phase
from upsguard.runs import RunKind, RunOrigin


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServiceState(_Model):
    """Who made the status: the running service, or the CLI reading the journal."""

    running: bool
    journal: str
    pid: int | None = None
    since: datetime | None = None
    poll_interval_s: float | None = None
    polls: int | None = Field(None, description="UPS polls since the service started")
    resumed: str | None = Field(None, description="the run this start resumed, if any")


class Hold(_Model):
    """A manual hold: automatic runbooks wait (down to the critical floor)."""

    reason: str
    who: str | None = None
    at: datetime | None = None


class UpsStatus(_Model):
    """One UPS as last read. ``link`` says whether the values are live (``ok``) or the last
    known ones (``stale``, ``lost``), and ``age_s`` how old they are then."""

    name: str
    polled: bool = Field(description="a reading exists; without one only ``error`` says why")
    status: str | None = Field(None, description="NUT status words, sorted: 'DISCHRG OB'")
    on_battery: bool = False
    charge_pct: float | None = None
    runtime_s: float | None = Field(
        None, description="runtime left: the smaller of the UPS's estimate and the observed drain"
    )
    reported_runtime_s: float | None = None
    depletion_pct_per_min: float | None = None
    load_pct: float | None = None
    input_voltage: float | None = None
    link: LinkState | None = None
    age_s: float | None = None
    at: datetime | None = None
    error: str | None = None


class FeedStatus(_Model):
    """A feed: at risk when fewer than ``needed`` of its UPSes supply from mains (its quorum)."""

    name: str
    state: str = Field(description="online, degraded, unknown, at-risk or low-battery")
    at_risk: bool
    online: int
    needed: int
    members: dict[str, str] = Field(description="each UPS's word: online, on-battery, lost, ...")
    runtime_s: float | None = None
    charge_pct: float | None = None
    depletion_pct_per_min: float | None = None
    low_battery: bool = False
    lost: bool = False
    at_risk_for_s: float = 0.0
    plan_s: float | None = Field(
        None, description="what this feed's shutdown would take from now, destage included"
    )
    unknown: int = Field(
        0,
        description="members that cannot be read (out of contact since last seen on mains, or "
        "never read); with on_lost_contact_while_on_line: alert they count in ``online``",
    )
    why: str | None = Field(
        None, description="when ``state`` is unknown: which members cannot be read, and why"
    )


class Trigger(_Model):
    """One ``policies.shutdown.when_any`` condition as it stands for one feed at risk."""

    condition: str
    feed: str
    holds: bool
    fires_in_s: float | None = Field(
        None,
        description="when it will hold at the present drain; None when that cannot be told "
        "(a flag, or no drain measured yet)",
    )
    figures: str = Field(
        "",
        description="the figures it stands on: 'runtime 13m >= plan 8m05s + destage 10m "
        "(not measured yet) + margin 5m'",
    )


class Countdown(_Model):
    """The race an outage is: the runtime left against what the shutdown still needs."""

    on_battery: bool
    runtime_left_s: float | None = Field(None, description="the lowest of the feeds at risk")
    plan_left_s: float | None = Field(
        None,
        description="the run in progress: the critical path of its steps not yet finished; "
        "otherwise the shutdown plan of the feeds at risk (or the site), destage included",
    )
    margin_s: float = Field(description="policies.required_margin")
    spare_s: float | None = Field(None, description="runtime left - plan left - margin")
    triggers: list[Trigger] = Field(default_factory=list)


class StepProgress(enum.StrEnum):
    """Where one step of a plan stands, as a person watching the run needs to know it."""

    WAITING = "waiting"
    """Not started: what it waits for is not finished (or no run of its plan is going)."""
    GATED = "gated"
    """What it waits for is finished; it waits for the caches in its data path to be clean."""
    RUNNING = "running"
    """Acting on its targets now."""
    DONE = "done"
    """Its targets reached the wanted state."""
    FELL_BACK = "fell_back"
    """Done, by its fallback (a hard power-off after the guest did not stop in time)."""
    FAILED = "failed"
    """Gave up after its retries and fallback."""
    SKIPPED = "skipped"
    """Not acted on: its fallback says leave it, or what it needs failed."""
    CANCELLED = "cancelled"
    """The run was cancelled or aborted before it finished."""
    INTERRUPTED = "interrupted"
    """The service stopped while it ran; the next start checks it again."""
    ABANDONED = "abandoned"
    """A controller that died left it running; checked again like an interrupted one."""


class StepStatus(_Model):
    id: str
    resource: str
    kind: str
    action: str
    description: str
    waits_for: list[str]
    state: StepProgress
    estimate_s: float = Field(description="what the plan expects it to take")
    started: datetime | None = None
    ended: datetime | None = None
    elapsed_s: float | None = Field(None, description="so far while it runs; in all once ended")
    detail: str = ""
    critical: bool = Field(description="on the plan's critical path")
    point_of_no_return: bool = Field(
        description="a shutdown step of hardware: once it starts, power back no longer cancels"
    )
    caches: list[str] = Field(default_factory=list, description="the caches that gate it")


class PlanStatus(_Model):
    """A plan with each step's state: the run's own, or the site's plan when none runs."""

    direction: Direction
    estimate_s: float
    critical_path: list[str]
    critical_path_s: float
    steps: list[StepStatus]


class RunningStep(_Model):
    step: str
    description: str
    under_way_since: datetime | None = None
    """When it was asked, for a request (a command run here, one sent over ssh, a task) a
    controller before this one made and this one waits for rather than make again: "under way
    since ... (started before the restart)"."""


class RunStatus(_Model):
    """The run in progress."""

    id: str
    kind: RunKind
    direction: Direction
    origin: RunOrigin
    reason: str
    started: datetime
    elapsed_s: float
    total: int
    finished: int
    failed: list[str]
    running: list[RunningStep]
    point_of_no_return: str | None = Field(
        None, description="the step at which the run passed its point of no return"
    )
    left_s: float | None = Field(
        None, description="the critical path of the steps not yet finished, as estimated"
    )
    plan: PlanStatus


class LastRun(_Model):
    """The newest run in the journal, finished or not."""

    id: str
    kind: str
    state: str
    started: datetime
    ended: datetime | None = None
    detail: str = ""


class CacheStatus(_Model):
    """One cache target: its mode and its dirty data on the way to the backing store."""

    cache: str
    target: str
    mode: str | None = None
    dirty_bytes: int | None = None
    clean: bool | None = None
    rate_bps: float | None = Field(None, description="destage rate measured from its history")
    eta_s: float | None = None
    error: str | None = None
    gates: list[str] = Field(
        default_factory=list, description="the shutdown steps that wait for it to be clean"
    )


class Alert(_Model):
    text: str


class PeerUps(_Model):
    """One UPS as another controller of the pair reads it."""

    name: str
    word: str = Field(
        description="online, on-battery, self-test, held, stale, lost, unknown, unread"
    )
    charge_pct: float | None = None
    runtime_s: float | None = None
    why: str = Field("", description="why it could not be read")


class PeerView(_Model):
    """What another controller of the pair published: its role and its readings."""

    name: str
    role: str
    at: datetime = Field(description="when it read them, by its own clock")
    ups: list[PeerUps] = Field(default_factory=list)


class PairStatus(_Model):
    """This controller's place in an active/standby pair (``ha:``), as it sees it now."""

    me: str
    role: str = Field(description="leader, standby, fenced or finishing_alone")
    leader: str | None = Field(None, description="who leads, as last seen (None: nobody)")
    token: int | None = Field(
        None, description="the fencing token: the leader key's revision for the term"
    )
    lease_age_s: float | None = Field(
        None, description="since the leader's last renewal that worked was sent (leader only)"
    )
    lease_ttl_s: float
    store_silent_s: float | None = Field(
        None, description="since the store stopped answering; None while it answers"
    )
    detail: str = ""
    shared_run: str | None = Field(
        None, description="the run in progress in the shared ledger, as last read"
    )
    shared_steps_done: int | None = None
    seen_age_s: float | None = Field(None, description="since the shared ledger was last read")
    alone: str | None = Field(None, description="who finishes alone without the store, and why")
    others: list[PeerView] = Field(
        default_factory=list,
        description="the other controllers' views, as last exchanged through the store",
    )
    others_age_s: float | None = Field(
        None, description="since the views were last exchanged; None: not yet"
    )


class SiteStatus(_Model):
    """Everything ``upsguard status`` and the web page show, at one moment (``at``)."""

    site: str
    at: datetime
    service: ServiceState
    phase: Phase
    phase_since: datetime | None = None
    held: Hold | None = None
    at_floor: bool = False
    ups: list[UpsStatus] = Field(default_factory=list)
    feeds: list[FeedStatus] = Field(default_factory=list)
    countdown: Countdown | None = None
    run: RunStatus | None = None
    last_run: LastRun | None = None
    unfinished_runs: list[str] = Field(
        default_factory=list, description="runs the next start resumes"
    )
    caches: list[CacheStatus] = Field(default_factory=list)
    alerts: list[Alert] = Field(default_factory=list)
    ha: PairStatus | None = Field(None, description="the controller pair, when ``ha:`` is set")
