"""The ``CoordinationStore`` protocol: what two controllers share to act as one.

A pair of controllers keeps three things in an existing store (etcd; a Kubernetes Lease
or Consul could follow), never in a consensus of its own:

* **who leads**: a key held by a lease of a few seconds. Winning it starts a ``Term``;
  the key's revision when it was won is the term's fencing ``token``.
* **the shared ledger**: the run records (``runs.RunRecord``) and the state of each step
  (``StepMark``), written by the leader only, each write fenced: the store applies it
  only while the leader key still has the term's revision, so a controller that lost
  the lease (paused, partitioned, slow) cannot write, and learns it (``LeadershipLost``).
* **finishing alone**: the leader's notice that it goes on without the store (the
  machines carrying the store are about to stop); no standby acts after it.

The standby reads all of it at one revision (``snapshot``) and waits for the next change
(``wait_for_change``). Every method may raise ``StoreUnavailable`` (no endpoint answered
in time, or no quorum) or ``AuthenticationError``; none retries for long, since the
caller (``engine.leadership``) owns the timing: a lease is only a few seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from upsguard.models import PowerState, ResourceId, ResourceKind, RunId, StepId, StepState
from upsguard.runs import RunRecord

MAX_MARKS = 100
"""The most step marks one ``record_steps`` writes: etcd refuses a transaction of more than
128 operations unless its members are started with a larger ``--max-txn-ops``."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A controller of the pair: its name (unique in the pair, the site file's ``ha.name``)
    and the resource of the machine it runs on, when the plan stops that machine."""

    name: str
    machine: ResourceId | None = None


@dataclass(frozen=True, slots=True)
class Leader:
    """Who holds the leader key, as the store says now, and the key's revision."""

    holder: Candidate
    token: int


@dataclass(frozen=True, slots=True)
class Term:
    """A won campaign. It lasts while its lease is renewed; every write the leader makes
    is fenced by ``token``. ``lease`` is the store's own id of the lease, opaque to
    everyone else; ``ttl_s`` is the lifetime the store granted (it may round up)."""

    holder: Candidate
    token: int
    lease: int
    ttl_s: float

    @property
    def leader(self) -> Leader:
        return Leader(self.holder, self.token)


@dataclass(frozen=True, slots=True)
class AskedTarget:
    """A request a platform accepted for one target of a step, not seen to land yet: the
    next leader waits for it instead of asking again (as a restarted controller waits for
    the requests its journal holds)."""

    platform: str
    kind: ResourceKind
    name: str
    wanted: PowerState


@dataclass(frozen=True, slots=True)
class StepMark:
    """One step of a run as the shared ledger knows it: its state, which controller wrote
    it and when (a step marked ``running`` by a controller that died is what the next
    leader re-checks in the real world before anything else), the requests it has under
    way, and whether the leader handed the run over at this step (the other controller
    then stops this one's machine, and its own last)."""

    step: StepId
    state: StepState
    by: str
    at: datetime
    detail: str = ""
    asked: tuple[AskedTarget, ...] = ()
    handed_over: bool = False


UPS_COMMAND = "ups:"
"""The mark a leader writes, fenced, before it sends a UPS the end command of a run, kept
beside the run's steps as a step of its own (``ups:NAME``): the controller that leads next
does not send that UPS a second one."""


def ups_command_mark(ups: str) -> StepId:
    return StepId(f"{UPS_COMMAND}{ups}")


def commanded_ups(mark: StepId) -> str | None:
    """The UPS a ``ups_command_mark`` is for; None for a step of the plan."""
    return mark.removeprefix(UPS_COMMAND) if mark.startswith(UPS_COMMAND) else None


@dataclass(frozen=True, slots=True)
class AloneNotice:
    """The leader goes on without the store from ``at``: a standby that reads this does
    not take over the run while the notice holds (``holds``)."""

    by: str
    token: int
    at: datetime
    reason: str

    def holds(self, leader: Leader | None) -> bool:
        """While its writer still holds the term it wrote it in (a controller finishing
        alone keeps renewing its lease as long as the store answers). Once that lease has
        ended, the controller that wrote it is gone (its machine stopped, or the site
        came back): the notice no longer binds anyone, and a new leader takes the run."""
        return leader is not None and (leader.holder.name, leader.token) == (self.by, self.token)


@dataclass(frozen=True, slots=True)
class OwedCaches:
    """The caches a leader took out of write-back, for the next leader to return."""

    caches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UpsSeen:
    """One UPS as a controller of the pair reads it: its word (``online``, ``on-battery``,
    ``self-test``, ``held``, ``stale``, ``lost``, ``unknown``; ``unread`` before any reading)
    and the figures read with it (None: not read), with why it could not be read."""

    ups: str
    word: str
    charge_pct: float | None = None
    runtime_s: float | None = None
    why: str = ""


@dataclass(frozen=True, slots=True)
class ControllerView:
    """What one controller of the pair reads of the UPSes, and its role, at ``at`` by its
    own clock. Each controller publishes its own, so that each shows the other's beside its
    own: two readings that disagree are what a person needs to see before an outage. It also
    carries what cannot wait for a fenced write: a debt of write-back passed to the leader."""

    by: str
    role: str
    at: datetime
    ups: tuple[UpsSeen, ...] = ()
    owes: tuple[str, ...] = ()
    """The caches it took out of write-back and may not return itself (not leading): the
    leader takes the debt over."""
    took: tuple[str, ...] = ()
    """The caches whose debt it took over from the other's ``owes``: the other drops them."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A key of the site whose value could not be read back (written by a newer version,
    or by hand); the rest of the snapshot stands without it."""

    key: str
    why: str


@dataclass(frozen=True, slots=True)
class SharedLedger:
    """Everything the store holds for a site, read at one ``revision``."""

    revision: int
    leader: Leader | None = None
    runs: tuple[RunRecord, ...] = ()
    """Oldest first: the order in which the leader first recorded them."""
    steps: Mapping[RunId, Mapping[StepId, StepMark]] = field(default_factory=dict)
    alone: AloneNotice | None = None
    unreadable: tuple[Unreadable, ...] = ()
    owed: tuple[str, ...] = ()
    """The caches a leader took out of write-back and has not returned yet: whoever leads
    next returns them once the outage is over."""

    @property
    def active(self) -> RunRecord | None:
        """The newest run, when it is in progress: the one a standby would resume. An older
        run still in progress was superseded (its end was not recorded: a write dropped
        while the store did not answer, or made alone), never resumed."""
        newest = self.runs[-1] if self.runs else None
        return newest if newest is not None and newest.active else None

    def handed_over(self, run: RunId) -> StepMark | None:
        """The mark of the step at which a leader handed ``run`` over, if one did."""
        return next((m for m in self.steps_of(run).values() if m.handed_over), None)

    def steps_of(self, run: RunId) -> Mapping[StepId, StepMark]:
        return self.steps.get(run, {})


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """One endpoint of the store as a probe found it: for ``doctor`` and ``status``."""

    endpoint: str
    answered: bool
    version: str | None = None
    is_leader: bool = False
    """This member leads the store's own consensus (not the controllers')."""
    detail: str = ""


@runtime_checkable
class CoordinationStore(Protocol):
    """Leadership and the shared ledger of one site, in a store both controllers reach.

    Every method may raise ``StoreUnavailable`` (no endpoint answered in time, no quorum)
    and ``AuthenticationError`` (the store refused the user or password; the message
    never holds the password). Fenced writes also raise ``LeadershipLost``. A method
    returns or raises within a bound the implementation documents (a few request
    timeouts): it never waits for the store to come back.
    """

    site: str

    async def campaign(self, candidate: Candidate, ttl_s: float) -> Term | Leader:
        """Try to become the leader: atomically, create the leader key held by a new lease
        of ``ttl_s`` seconds if and only if no key exists. Returns the ``Term`` won, or the
        ``Leader`` that holds the key (possibly this very candidate from a term it cannot
        renew any more, such as a process that restarted: it waits for that lease to end
        like any other). Safe to call again after a timeout: a campaign that did land is
        found and returned as won."""
        ...

    async def renew(self, term: Term) -> float:
        """Keep the term's lease alive; returns the seconds it now has to live. Raises
        ``LeadershipLost`` when the lease is gone (expired or revoked): the term is over."""
        ...

    async def resign(self, term: Term) -> None:
        """End the term now (a handover): the leader key goes, if it is still this term's,
        and so does the lease, so a standby need not wait for the lease to run out. A term
        already over resigns quietly."""
        ...

    async def leader(self) -> Leader | None:
        """Who holds the leader key now, and its revision (the token of their term)."""
        ...

    async def record_run(self, term: Term, record: RunRecord) -> None:
        """Write a run record (replacing the run's earlier one), fenced by ``term``.
        Raises ``LeadershipLost`` when the leader key no longer has the term's token."""
        ...

    async def record_step(self, term: Term, run: RunId, mark: StepMark) -> None:
        """Write one step's state in a run, fenced by ``term``: the write that says a step
        has started must land before the step acts. Raises ``LeadershipLost``."""
        ...

    async def record_steps(self, term: Term, marks: Sequence[tuple[RunId, StepMark]]) -> None:
        """Write several steps' states (of one run or more) in one fenced write: all of them,
        in order, or none. At most ``MAX_MARKS``. Raises ``LeadershipLost``."""
        ...

    async def forget_run(self, term: Term, run: RunId) -> None:
        """Remove a run and its steps (the ledger keeps only the newest runs), fenced.
        Raises ``LeadershipLost``."""
        ...

    async def record_owed(self, term: Term, owed: OwedCaches) -> None:
        """Write which caches the leaders owe write-back (replacing the list), fenced.
        Raises ``LeadershipLost``."""
        ...

    async def declare_alone(self, term: Term, notice: AloneNotice) -> None:
        """Record that the leader finishes alone, fenced. Raises ``LeadershipLost``."""
        ...

    async def exchange_views(self, view: ControllerView, ttl_s: float) -> list[ControllerView]:
        """Publish this controller's ``view`` (not fenced: both controllers do), held by a
        lease of its own that this call renews, so that it goes ``ttl_s`` after its
        controller stopped publishing; returns the views the other controllers published
        that are still held. Views are not part of the ledger (``snapshot``), but writing
        one is a change of the site (``wait_for_change``)."""
        ...

    async def snapshot(self) -> SharedLedger:
        """The leader, runs, steps and notice of the site, all read at one revision."""
        ...

    async def wait_for_change(self, after_revision: int, within_s: float) -> bool:
        """Wait until something of the site changes after ``after_revision``; True when a
        change came (it may have come before the call: none is missed), False when
        ``within_s`` passed without one being seen. A follower then reads ``snapshot``
        again either way."""
        ...

    async def probe(self) -> list[EndpointHealth]:
        """Ask each endpoint on its own whether it answers; never raises: a dead endpoint
        is an ``EndpointHealth`` that did not answer."""
        ...

    async def close(self) -> None:
        """Let go of the connections. The lease is not revoked (``resign`` does that):
        a controller that stops without resigning is taken over when its lease ends."""
        ...
