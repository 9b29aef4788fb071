"""What a plan is: steps, what each waits for, how each is carried out, and the figures
reported about it.

A step carries everything the executor needs (``StepSettings``, resolved from the site
file when the plan is made), so the executor never reads the site file.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from upsguard.config.resources import Fallback, ResourceConfig
from upsguard.models import (
    CacheName,
    Direction,
    PlatformName,
    ResourceId,
    ResourceKind,
    StepId,
    Target,
)


class Action(enum.StrEnum):
    GUEST_SHUTDOWN = "guest_shutdown"
    HOST_SHUTDOWN = "host_shutdown"
    DEVICE_SHUTDOWN = "device_shutdown"
    COMMAND = "command"
    POWER_ON = "power_on"
    HOST_POWER_ON = "host_power_on"
    BARRIER = "barrier"


@dataclass(frozen=True, slots=True)
class LearnedDuration:
    """How long one resource's step took in past runs (real runs and drills), from the journal.

    Plans use ``p90_s``: the runtime trigger (``runtime < plan + margin``) must start the
    shutdown early enough for a slow outage, not a typical one; ``median_s`` is what a
    typical outage takes, shown beside it.
    """

    median_s: float
    p90_s: float
    runs: int
    """How many runs the figures come from."""
    per_member: bool = False
    """Learned from the steps of single VMs of a group expanded from live inventory, not
    from whole-group steps: a figure for one member."""

    @property
    def source(self) -> str:
        return f"p90 of {self.runs} run{'s' if self.runs != 1 else ''}"


Durations = Mapping[tuple[ResourceId, Direction], LearnedDuration]
"""Learned figures per resource and direction (``stop`` or ``start``)."""


class EstimateSource(enum.StrEnum):
    """Where a step's estimate came from when no run taught it (learned ones say ``p90 of N
    runs``)."""

    ESTIMATE = "estimate"
    """The resource's ``estimate:`` in the site file."""
    PLATFORM = "platform"
    """The simulated platform's typical duration for the action."""
    DEFAULT = "default"
    """upsguard's default for the resource's kind."""
    OWN_MACHINE = "up before the startup"
    """The machine upsguard runs on, in a startup: it is up before the startup it runs can
    begin, so its boot is no part of it (the step finds it up)."""


@dataclass(frozen=True, slots=True)
class Quorum:
    """Where a cluster's quorum ends in a shutdown: the node steps down, of its nodes."""

    platform: PlatformName
    down: int
    nodes: int


@dataclass(frozen=True, slots=True)
class StepSettings:
    """How one step is carried out, from its resource's entry and its platform."""

    resource: ResourceConfig
    """What the platform resolves targets from (VM name, selector, address) and what the
    health checks of a startup read."""
    timeout_s: float
    """Shutdown: how long a graceful stop may take before the fallback. Startup: how long
    until the target is on and healthy."""
    retries: int
    """How often a request that failed for a while, or hung, is asked again."""
    fallback: Fallback
    """After ``timeout_s`` of a shutdown: power off, leave it running, or fail the step."""
    fallback_without_graceful: Fallback
    """When there is no graceful path at all (no VMware Tools): the platform may say skip."""
    power_on_via: PlatformName | None = None
    """Startup: the platform (a BMC, Wake-on-LAN) that powers the target on."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a runbook: one resource (or one member of a VM group), or a barrier."""

    id: StepId
    resource: ResourceId
    kind: ResourceKind
    platform: str | None
    action: Action
    waits_for: tuple[StepId, ...]
    estimate_s: float
    description: str
    settings: StepSettings | None = None  # None only for barriers
    targets: tuple[Target, ...] = ()
    members: int = 1  # the VMs a group step covers
    member: bool = False
    """One VM of a group expanded from live inventory (``stop:web/web-01``), not the
    resource as a whole: its duration is learned per member."""
    caches: tuple[CacheName, ...] = ()
    direct: bool = False
    estimate_source: str = EstimateSource.DEFAULT.value
    """Where ``estimate_s`` came from, in words: ``p90 of 4 runs``, ``estimate``,
    ``platform``, ``default`` (barriers: ``default``, they take no time)."""
    learned: LearnedDuration | None = None
    """The learned figure the estimate counts on, if any."""
    configured_s: float | None = None
    """The configured estimate, when a learned figure is below it (the plan says so; the
    estimate is held at ``policies.learning.may_lower_to_pct`` of it)."""
    quorum_ends: Quorum | None = None
    """A shutdown's node step after which its cluster has lost its quorum (no more than
    half its nodes up): every API action that needs the quorum comes before it."""

    @property
    def is_cluster_state(self) -> bool:
        """HA disarmed, Ceph flags set: the cluster's state, which needs its quorum."""
        return self.kind is ResourceKind.CLUSTER

    @property
    def is_point_of_no_return(self) -> bool:
        """Hardware going down: after this, a returning mains no longer cancels the run."""
        return self.kind in (ResourceKind.HOST, ResourceKind.STORAGE)


@dataclass(frozen=True)
class Plan:
    direction: Direction
    steps: tuple[Step, ...]  # in a valid order: every step after the ones it waits for
    critical_path: tuple[StepId, ...]
    critical_path_s: float
    estimate_s: float  # with the per-platform parallelism limits
    limits: dict[str, int] = field(default_factory=dict)
    stop_on_failure: bool = False
    """A failed step keeps what waits on it from starting (startup; shutdown with
    ``policies.step_failure: stop``)."""
    left_to_ups: tuple[ResourceId, ...] = ()  # after upsguard's own machine: they lose power
    notes: tuple[str, ...] = ()

    @functools.cached_property
    def caches(self) -> tuple[CacheName, ...]:
        """The caches in the data path of the plan's hardware."""
        return tuple(sorted({c for step in self.steps for c in step.caches}))

    def step(self, sid: StepId) -> Step:
        return self.by_id()[sid]

    def by_id(self) -> dict[StepId, Step]:
        return {s.id: s for s in self.steps}

    def dependents(self) -> dict[StepId, list[StepId]]:
        out: dict[StepId, list[StepId]] = {s.id: [] for s in self.steps}
        for s in self.steps:
            for w in s.waits_for:
                out[w].append(s.id)
        return out
