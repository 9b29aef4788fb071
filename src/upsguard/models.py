"""In-memory values shared by every layer: ids, enums and frozen results.

They are plain frozen dataclasses so that plugins, the policy engine, the
executor and the simulator exchange the same values; what the journal stores
is its own row type, not these.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NewType

ResourceId = NewType("ResourceId", str)
UpsName = NewType("UpsName", str)
PlatformName = NewType("PlatformName", str)
CacheName = NewType("CacheName", str)
StepId = NewType("StepId", str)
RunId = NewType("RunId", str)


class Direction(enum.StrEnum):
    """Which way a runbook goes: stopping the site, or starting it again."""

    SHUTDOWN = "shutdown"
    STARTUP = "startup"


class Phase(enum.StrEnum):
    """Where the site is in an outage; see ``policies.phases`` for the moves."""

    NORMAL = "normal"
    ON_BATTERY = "on_battery"
    SHEDDING = "shedding"
    SHUTTING_DOWN = "shutting_down"
    DOWN = "down"
    RECOVERING = "recovering"


class ResourceKind(enum.StrEnum):
    VM = "vm"
    VM_GROUP = "vm_group"
    HOST = "host"
    STORAGE = "storage"
    SWITCH = "switch"
    COMMAND = "command"
    CLUSTER = "cluster"
    """A cluster's own state around a shutdown (Proxmox VE's HA stack, its Ceph flags): the
    shutdown changes it, the startup puts it back."""

    @property
    def is_hardware(self) -> bool:
        """Hardware steps are the point of no return and wait for clean caches."""
        return self in (ResourceKind.HOST, ResourceKind.STORAGE, ResourceKind.SWITCH)


class UpsFlag(enum.StrEnum):
    """NUT's ups.status words; SNMP sources map their MIB values onto these."""

    OL = "OL"
    OB = "OB"
    LB = "LB"
    HB = "HB"
    RB = "RB"
    CHRG = "CHRG"
    DISCHRG = "DISCHRG"
    BYPASS = "BYPASS"
    CAL = "CAL"
    OFF = "OFF"
    OVER = "OVER"
    TRIM = "TRIM"
    BOOST = "BOOST"
    FSD = "FSD"
    ALARM = "ALARM"


@dataclass(frozen=True, slots=True)
class Fact:
    """A yes-or-no fact about the site as it was read: known true, known false, or unknown,
    with why.

    A reading that failed (unreachable, timed out, garbage) is unknown, and unknown is never
    good news: a gate passes only on ``is_true``, and what counts something as off or clean
    asks ``is_true`` of that. ``if fact:`` is refused (``TypeError``): it would take unknown
    for one of the answers.
    """

    value: bool | None
    why: str = ""

    @classmethod
    def true(cls, why: str = "") -> Fact:
        return cls(True, why)

    @classmethod
    def false(cls, why: str = "") -> Fact:
        return cls(False, why)

    @classmethod
    def unknown(cls, why: str) -> Fact:
        return cls(None, why)

    @property
    def is_true(self) -> bool:
        return self.value is True

    @property
    def is_false(self) -> bool:
        return self.value is False

    @property
    def known(self) -> bool:
        return self.value is not None

    def __bool__(self) -> bool:
        raise TypeError("a Fact may be unknown: ask is_true or is_false")

    @classmethod
    def all_of(cls, facts: Iterable[Fact], nothing: str) -> Fact:
        """True only when there is at least one fact and each is true; false when one is
        false; unknown otherwise, and when there is none at all (``nothing`` says why):
        ``all(...)`` over nothing would be true."""
        seen = list(facts)
        if not seen:
            return cls.unknown(nothing)
        false = next((f for f in seen if f.is_false), None)
        if false is not None:
            return false
        unknown = next((f for f in seen if not f.known), None)
        return unknown if unknown is not None else cls.true()


class LinkState(enum.StrEnum):
    OK = "ok"
    STALE = "stale"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class UpsReading:
    """One normalized reading of one UPS.

    ``link`` is not ``ok`` when the values are the last known ones; ``age_s``
    then says how old they are. A reading that is not ``ok`` is never taken
    as proof that the UPS is on line.
    """

    ups: UpsName
    at: datetime
    flags: frozenset[UpsFlag] = frozenset()
    charge_pct: float | None = None
    runtime_s: float | None = None
    load_pct: float | None = None
    input_voltage: float | None = None
    link: LinkState = LinkState.OK
    age_s: float = 0.0
    raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def on_battery(self) -> bool:
        return UpsFlag.OB in self.flags

    @property
    def on_line(self) -> bool:
        """True only for a live reading that says OL and not OB."""
        return self.link is LinkState.OK and UpsFlag.OL in self.flags and not self.on_battery

    @property
    def low_battery(self) -> bool:
        return UpsFlag.LB in self.flags

    @property
    def forced_shutdown(self) -> bool:
        return UpsFlag.FSD in self.flags


class PowerState(enum.StrEnum):
    ON = "on"
    OFF = "off"
    STANDBY = "standby"
    UNKNOWN = "unknown"


class StopMethod(enum.StrEnum):
    """How a platform is asked to stop a target."""

    GRACEFUL = "graceful"  # guest shutdown, OS shutdown, soft power-off
    HARD = "hard"  # power off now


@dataclass(frozen=True, slots=True)
class Target:
    """One thing a platform can power: a VM, a host, a device.

    ``name`` is what the platform calls it; ``ref`` is the platform's own id
    where it has one (a vSphere managed object id); ``host`` is the host a VM
    runs on, when known; ``system`` marks platform-owned VMs (vCLS); ``direct``
    asks the platform to reach the target without its manager (vCenter down).
    ``graceful`` says whether a graceful stop was possible when the target was
    resolved (VMware Tools running), None when unknown; it is a hint for the plan
    text, not part of the target's identity.
    """

    platform: PlatformName
    kind: ResourceKind
    name: str
    ref: str | None = None
    host: str | None = None
    system: bool = False
    direct: bool = False
    graceful: bool | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class CommandProcess:
    """A step's command started here, in a session of its own (the ``command`` platform): it
    outlives the controller, so a restarted one must find it rather than start it again.

    ``pid`` with ``start_ticks`` (field 22 of ``/proc/PID/stat``, clock ticks since boot)
    names the process: a PID reused by another process has another start time. ``session``
    is its session id. ``exit_file`` is where the command's own session writes its exit
    status when it ends, since the exit status is lost with the parent that started it.
    ``started`` is when it was started: its timeout counts from then, across restarts.
    """

    pid: int
    start_ticks: int
    session: int
    exit_file: str
    started: datetime


class CacheMode(enum.StrEnum):
    WRITE_BACK = "write-back"
    WRITE_THROUGH = "write-through"
    WRITE_AROUND = "write-around"
    CLEANER = "cleaner"  # dm-writecache draining, its only safe mode
    NONE = "none"
    UNKNOWN = "unknown"

    @property
    def holds_no_new_writes(self) -> bool:
        """Read as a mode whose writes go to the backing device: with no dirty data left, the
        cache is clean. ``unknown`` never is: a mode that could not be read may still be
        taking writes into the cache."""
        return self in _NO_NEW_WRITES


_NO_NEW_WRITES = frozenset(
    {CacheMode.WRITE_THROUGH, CacheMode.WRITE_AROUND, CacheMode.CLEANER, CacheMode.NONE}
)


@dataclass(frozen=True, slots=True)
class CacheTarget:
    """One cache device or policy a provider manages (a bcache device, a VM's FVP policy)."""

    cache: CacheName
    name: str


@dataclass(frozen=True, slots=True)
class CacheState:
    """What a provider read: the mode and how much data is not yet on the backing store.

    ``dirty_bytes`` is None when the device has no counter (a RAID controller);
    then ``clean`` is the provider's own judgement (flush done, policy reads WT).
    """

    target: CacheTarget
    at: datetime
    mode: CacheMode
    dirty_bytes: int | None
    clean: bool
    detail: str = ""


class StepState(enum.StrEnum):
    """Where one step of a run stands; the journal keeps one row per attempt."""

    RUNNING = "running"
    """Started and not finished yet."""
    DONE = "done"
    """Its targets reached the wanted state (already off counts)."""
    FAILED = "failed"
    """Gave up after its retries and fallback; the detail says why."""
    SKIPPED = "skipped"
    """Not acted on: its fallback says to leave it running, or what it needs failed."""
    CANCELLED = "cancelled"
    """The run was cancelled (power back before the point of no return, or an abort)."""
    INTERRUPTED = "interrupted"
    """The service was stopped while it ran: neither failed nor done. The next start
    re-checks it against the real world before anything that depends on it."""
    ABANDONED = "abandoned"
    """Left running by a controller that died (``kill -9``, a crash); re-checked like an
    interrupted one."""

    @property
    def finished(self) -> bool:
        """Finished for good in its run: resume does not run it again."""
        return self in (StepState.DONE, StepState.SKIPPED)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """How one step ended, in words a person can read at 3 a.m."""

    step: StepId
    state: StepState
    started: datetime
    ended: datetime
    detail: str
    attempts: int = 1
    fallback_used: bool = False
    already_there: bool = False
    """Every target was in the wanted state already: nothing was asked of the platform."""
    left_running: int = 0
    """Targets of a done group step left running (fallback ``skip``): its resource is not
    known off."""
