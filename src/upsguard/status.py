"""The status of a site: the one contract between the service and whoever watches it.

The local API answers ``GET /status`` with it, ``upsguard status`` prints it, and the web
page draws it. One builder (``controller.status``) makes it, from the running service or,
when none runs, from the journal and one fresh poll of each UPS; both ways fill the same
fields, and ``service.running`` says which way it was made. Fields only a running service
can know (the countdown, the run in progress, the caches' drain) are then empty, never
missing.

It lives with the core models, below every layer, because both sides of the socket read
it: the controller writes it, the CLI and the web page parse it back (``read_status``).
Its JSON Schema (``status_schema``) is what the API's tests validate answers against;
adding a field is compatible, renaming one is not.

The models are msgspec structs, not pydantic models as the site file's are: ``upsguard
status`` reads this and nothing else of the project's models, and importing pydantic and
building its models took longer than the whole command may (``bench/cli_start.py``).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import Meta

from upsguard.models import Direction, LinkState, Phase
from upsguard.runs import RunKind, RunOrigin


class _Model(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Frozen, and an unknown field is an error. Each model says ``frozen`` and ``kw_only``
    again: the type checker wants ``frozen`` said alike along the line, and msgspec takes
    ``kw_only`` for the fields of the class that says it alone."""


class ServiceState(_Model, frozen=True, kw_only=True):
    """Who made the status: the running service, or the CLI reading the journal."""

    running: bool
    journal: str
    pid: int | None = None
    since: datetime | None = None
    poll_interval_s: float | None = None
    polls: Annotated[int | None, Meta(description="UPS polls since the service started")] = None
    resumed: Annotated[str | None, Meta(description="the run this start resumed, if any")] = None


class Hold(_Model, frozen=True, kw_only=True):
    """A manual hold: automatic runbooks wait (down to the critical floor)."""

    reason: str
    who: str | None = None
    at: datetime | None = None


class UpsStatus(_Model, frozen=True, kw_only=True):
    """One UPS as last read. ``link`` says whether the values are live (``ok``) or the last
    known ones (``stale``, ``lost``), and ``age_s`` how old they are then."""

    name: str
    polled: Annotated[
        bool, Meta(description="a reading exists; without one only ``error`` says why")
    ]
    status: Annotated[str | None, Meta(description="NUT status words, sorted: 'DISCHRG OB'")] = None
    on_battery: bool = False
    charge_pct: float | None = None
    runtime_s: Annotated[
        float | None,
        Meta(description="runtime left: the smaller of the UPS's estimate and the observed drain"),
    ] = None
    reported_runtime_s: float | None = None
    depletion_pct_per_min: float | None = None
    load_pct: float | None = None
    input_voltage: float | None = None
    link: LinkState | None = None
    age_s: float | None = None
    at: datetime | None = None
    error: str | None = None


class FeedStatus(_Model, frozen=True, kw_only=True):
    """A feed: at risk when fewer than ``needed`` of its UPSes supply from mains (its quorum)."""

    name: str
    state: Annotated[str, Meta(description="online, degraded, unknown, at-risk or low-battery")]
    at_risk: bool
    online: int
    needed: int
    members: Annotated[
        dict[str, str], Meta(description="each UPS's word: online, on-battery, lost, ...")
    ]
    runtime_s: float | None = None
    charge_pct: float | None = None
    depletion_pct_per_min: float | None = None
    low_battery: bool = False
    lost: bool = False
    at_risk_for_s: float = 0.0
    plan_s: Annotated[
        float | None,
        Meta(description="what this feed's shutdown would take from now, destage included"),
    ] = None
    unknown: Annotated[
        int,
        Meta(
            description="members that cannot be read (out of contact since last seen on mains, or "
            "never read); with on_lost_contact_while_on_line: alert they count in ``online``"
        ),
    ] = 0
    why: Annotated[
        str | None,
        Meta(description="when ``state`` is unknown: which members cannot be read, and why"),
    ] = None


class Trigger(_Model, frozen=True, kw_only=True):
    """One ``policies.shutdown.when_any`` condition as it stands for one feed at risk."""

    condition: str
    feed: str
    holds: bool
    fires_in_s: Annotated[
        float | None,
        Meta(
            description="when it will hold at the present drain; None when that cannot be told "
            "(a flag, or no drain measured yet)"
        ),
    ] = None
    figures: Annotated[
        str,
        Meta(
            description="the figures it stands on: 'runtime 13m >= plan 8m05s + destage 10m "
            "(not measured yet) + margin 5m'"
        ),
    ] = ""


class Countdown(_Model, frozen=True, kw_only=True):
    """The race an outage is: the runtime left against what the shutdown still needs."""

    on_battery: bool
    runtime_left_s: Annotated[float | None, Meta(description="the lowest of the feeds at risk")] = (
        None
    )
    plan_left_s: Annotated[
        float | None,
        Meta(
            description="the run in progress: the critical path of its steps not yet finished; "
            "otherwise the shutdown plan of the feeds at risk (or the site), destage included"
        ),
    ] = None
    margin_s: Annotated[float, Meta(description="policies.required_margin")]
    spare_s: Annotated[float | None, Meta(description="runtime left - plan left - margin")] = None
    triggers: list[Trigger] = msgspec.field(default_factory=list)


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


class StepStatus(_Model, frozen=True, kw_only=True):
    id: str
    resource: str
    kind: str
    action: str
    description: str
    waits_for: list[str]
    state: StepProgress
    estimate_s: Annotated[float, Meta(description="what the plan expects it to take")]
    started: datetime | None = None
    ended: datetime | None = None
    elapsed_s: Annotated[
        float | None, Meta(description="so far while it runs; in all once ended")
    ] = None
    detail: str = ""
    critical: Annotated[bool, Meta(description="on the plan's critical path")]
    point_of_no_return: Annotated[
        bool,
        Meta(
            description="a shutdown step of hardware: once it starts, power back no longer cancels"
        ),
    ]
    caches: Annotated[list[str], Meta(description="the caches that gate it")] = msgspec.field(
        default_factory=list
    )


class PlanStatus(_Model, frozen=True, kw_only=True):
    """A plan with each step's state: the run's own, or the site's plan when none runs."""

    direction: Direction
    estimate_s: float
    critical_path: list[str]
    critical_path_s: float
    steps: list[StepStatus]


class RunningStep(_Model, frozen=True, kw_only=True):
    step: str
    description: str
    under_way_since: datetime | None = None
    """When it was asked, for a request (a command run here, one sent over ssh, a task) a
    controller before this one made and this one waits for rather than make again: "under way
    since ... (started before the restart)"."""


class RunStatus(_Model, frozen=True, kw_only=True):
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
    point_of_no_return: Annotated[
        str | None, Meta(description="the step at which the run passed its point of no return")
    ] = None
    left_s: Annotated[
        float | None,
        Meta(description="the critical path of the steps not yet finished, as estimated"),
    ] = None
    plan: PlanStatus


class LastRun(_Model, frozen=True, kw_only=True):
    """The newest run in the journal, finished or not."""

    id: str
    kind: str
    state: str
    started: datetime
    ended: datetime | None = None
    detail: str = ""


class CacheStatus(_Model, frozen=True, kw_only=True):
    """One cache target: its mode and its dirty data on the way to the backing store."""

    cache: str
    target: str
    mode: str | None = None
    dirty_bytes: int | None = None
    clean: bool | None = None
    rate_bps: Annotated[
        float | None, Meta(description="destage rate measured from its history")
    ] = None
    eta_s: float | None = None
    error: str | None = None
    gates: Annotated[
        list[str], Meta(description="the shutdown steps that wait for it to be clean")
    ] = msgspec.field(default_factory=list)


class Alert(_Model, frozen=True, kw_only=True):
    text: str


class PeerUps(_Model, frozen=True, kw_only=True):
    """One UPS as another controller of the pair reads it."""

    name: str
    word: Annotated[
        str, Meta(description="online, on-battery, self-test, held, stale, lost, unknown, unread")
    ]
    charge_pct: float | None = None
    runtime_s: float | None = None
    why: Annotated[str, Meta(description="why it could not be read")] = ""


class PeerView(_Model, frozen=True, kw_only=True):
    """What another controller of the pair published: its role and its readings."""

    name: str
    role: str
    at: Annotated[datetime, Meta(description="when it read them, by its own clock")]
    ups: list[PeerUps] = msgspec.field(default_factory=list)


class PairStatus(_Model, frozen=True, kw_only=True):
    """This controller's place in an active/standby pair (``ha:``), as it sees it now."""

    me: str
    role: Annotated[str, Meta(description="leader, standby, fenced or finishing_alone")]
    leader: Annotated[str | None, Meta(description="who leads, as last seen (None: nobody)")] = None
    token: Annotated[
        int | None, Meta(description="the fencing token: the leader key's revision for the term")
    ] = None
    lease_age_s: Annotated[
        float | None,
        Meta(description="since the leader's last renewal that worked was sent (leader only)"),
    ] = None
    lease_ttl_s: float
    store_silent_s: Annotated[
        float | None, Meta(description="since the store stopped answering; None while it answers")
    ] = None
    detail: str = ""
    shared_run: Annotated[
        str | None, Meta(description="the run in progress in the shared ledger, as last read")
    ] = None
    shared_steps_done: int | None = None
    seen_age_s: Annotated[
        float | None, Meta(description="since the shared ledger was last read")
    ] = None
    alone: Annotated[
        str | None, Meta(description="who finishes alone without the store, and why")
    ] = None
    others: Annotated[
        list[PeerView],
        Meta(description="the other controllers' views, as last exchanged through the store"),
    ] = msgspec.field(default_factory=list)
    others_age_s: Annotated[
        float | None, Meta(description="since the views were last exchanged; None: not yet")
    ] = None


class SiteStatus(_Model, frozen=True, kw_only=True):
    """Everything ``upsguard status`` and the web page show, at one moment (``at``)."""

    site: str
    at: datetime
    service: ServiceState
    phase: Phase
    phase_since: datetime | None = None
    held: Hold | None = None
    at_floor: bool = False
    ups: list[UpsStatus] = msgspec.field(default_factory=list)
    feeds: list[FeedStatus] = msgspec.field(default_factory=list)
    countdown: Countdown | None = None
    run: RunStatus | None = None
    last_run: LastRun | None = None
    unfinished_runs: Annotated[list[str], Meta(description="runs the next start resumes")] = (
        msgspec.field(default_factory=list)
    )
    caches: list[CacheStatus] = msgspec.field(default_factory=list)
    alerts: list[Alert] = msgspec.field(default_factory=list)
    ha: Annotated[
        PairStatus | None, Meta(description="the controller pair, when ``ha:`` is set")
    ] = None
