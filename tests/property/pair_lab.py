"""Two controllers on the virtual clock, in one world, for the pair's invariants.

The world is ``OutageLab``'s (mains and batteries, the simulated platforms and caches, every
request checked the moment a platform accepts it); in it run two controller processes, each
``upsguard run`` with its own site file (its own machine ``runs_upsguard``, the other's
``ha.peer_machine``), its own journal, its own link to each UPS, and its own link to ONE
coordination store: ``MemorySite``, the in-memory store held to etcd's contract tests, whose
leases end on the same virtual clock. Its three members live on the two controllers'
machines and the NAS (``ha.store_machines``): with two of them down it has no quorum.

The test breaks the store as etcd breaks (``StoreFaults``): it loses its quorum (every call
``StoreUnavailable``, after a request timeout), one controller is cut off from it, a write is
lost on its way, or a call is answered with an error the etcd backend raises
(``StoreUnavailable``, ``AuthenticationError``, ``PermanentError``, ``LeadershipLost``). A
controller can be paused (SIGSTOP: it reaches nothing until woken; a request its tasks got
to meanwhile re-checks its term first, as a woken process does) right after a claim was
written, and woken later.

Besides the engine's rules, each request and UPS command is checked for the pair's:
- while no controller goes on without the store, a target is never asked again while a
  request to it is under way, whichever controller made it;
- a controller that acts with the store (not alone) holds the leader key, on a lease the
  store has not ended: a standby acts only after the leader's lease expired by the store's
  clock;
- no policy's shutdown starts or resumes while every feed it concerns has been on mains
  for a while, as the controller that starts it could read;
and, every second of virtual time: a lease after the store came back for both, at most one
controller may act; a controller that finished alone rejoins once its run is over and the
store answers; every loop of both services is alive.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.property.lab import SITE, Life, OutageLab, Seat, Seen, _said
from upsguard.controller.service import Service, StoreBuilder
from upsguard.engine.leadership import Role
from upsguard.errors import (
    AuthenticationError,
    LeadershipLost,
    PermanentError,
    StoreUnavailable,
    UpsguardError,
)
from upsguard.events import Event, RunStarted, UpsCommandSent
from upsguard.models import LinkState, PowerState, ResourceId, RunId, StepState, UpsName
from upsguard.plugins.coordination.base import (
    AloneNotice,
    Candidate,
    ControllerView,
    EndpointHealth,
    Leader,
    OwedCaches,
    SharedLedger,
    StepMark,
    Term,
    ups_command_mark,
)
from upsguard.plugins.coordination.memory import LEADER, MemorySite, MemoryStore
from upsguard.plugins.coordination.records import decode
from upsguard.runs import RunKind, RunOrigin, RunRecord

NAMES = ("ctl-a", "ctl-b")
MACHINES = {"ctl-a": ResourceId("mgmt-a"), "ctl-b": ResourceId("mgmt-b")}
STORE_MACHINES = (ResourceId("mgmt-a"), ResourceId("mgmt-b"), ResourceId("nas"))
TTL_S = 10.0
REQUEST_TIMEOUT_S = 1.0
"""How long a call to a store that does not answer takes to fail (``ha.request_timeout``)."""
SAMPLE_S = 1.0
"""How often the rules over time are checked on the virtual clock."""
MAINS_FOR_S = 15.0
"""How long every UPS of a feed must have been on mains, readable, without FSD or a
self-test, for a policy's shutdown of it to be one started on mains (three polls: a
controller decides on the readings of its last poll)."""

_ONE_MACHINE = (
    "  - {{id: mgmt, kind: host, platform: own, runs_upsguard: true, watts: 10, "
    "depends_on: [sw],\n     estimate: {{stop: 1m}}}}\n"
)
_MACHINE = """  - {{id: @ID@, kind: host, platform: own,@OWN@ watts: 10, depends_on: [sw],
     estimate: {{stop: 1m}}}}
"""
_HA = """ha: {{name: @NAME@, peer_machine: @PEER@, lease_ttl: 10s, fence_margin: 1s,
      endpoints: ["http://127.0.0.1:23791", "http://127.0.0.1:23792", "http://127.0.0.1:23793"],
      store_machines: [mgmt-a, mgmt-b, nas]}}
"""


def pair_site(name: str) -> str:
    """The lab's site file as controller ``name`` has it: the same site, two controllers'
    machines instead of one, its own ``runs_upsguard``, and the ``ha:`` section."""
    peer = next(n for n in NAMES if n != name)
    assert _ONE_MACHINE in SITE
    machines = "".join(
        _MACHINE.replace("@ID@", MACHINES[n]).replace(
            "@OWN@", " runs_upsguard: true," if n == name else ""
        )
        for n in NAMES
    )
    text = SITE.replace(_ONE_MACHINE, machines).replace(
        "powers: [h1, h2, nas, sw, mgmt]", "powers: [h1, h2, nas, sw, mgmt-a, mgmt-b]"
    )
    return text + _HA.replace("@NAME@", name).replace("@PEER@", MACHINES[peer])


ERRORS: dict[str, type[UpsguardError]] = {
    "unavailable": StoreUnavailable,
    "authentication": AuthenticationError,
    "permanent": PermanentError,
    "leadership lost": LeadershipLost,
}
"""What the etcd backend raises, by the name the machine draws: no endpoint answered; a
refused login or permission; "revision of auth store is old", a request etcd refuses; a
lease gone or a fence that failed."""
SAID = {
    StoreUnavailable: "no endpoint answered",
    AuthenticationError: "user 'upsguard' was logged out: invalid auth token",
    PermanentError: "etcdserver: revision of auth store is old",
    LeadershipLost: "the lease has ended",
}
LEASED = {
    "renew",
    "record_run",
    "record_step",
    "record_steps",
    "record_owed",
    "forget_run",
    "declare_alone",
}
"""The calls etcd answers ``LeadershipLost`` to."""
WRITES = LEASED - {"renew"}


@dataclass
class StoreFaults:
    """The store as the test breaks it, and each controller's link to it."""

    members_up: Any = None
    """How many of the store's members run (their machines on): below two, no quorum."""
    quorum_lost: bool = False
    cut: set[str] = field(default_factory=set)
    errors: dict[str, list[type[UpsguardError]]] = field(default_factory=dict)
    """Per controller, the errors its next calls are answered with (``LeadershipLost`` waits
    for a call etcd would answer it to)."""
    lost_writes: dict[str, int] = field(default_factory=dict)
    """Per controller, how many of its next writes are lost on their way (not applied)."""
    pause_after_claim: set[str] = field(default_factory=set)

    def answers(self, name: str) -> bool:
        return not self.quorum_lost and self.quorum() and name not in self.cut

    def quorum(self) -> bool:
        return self.members_up is None or self.members_up() >= 2

    def broken_for(self, name: str) -> bool:
        """Anything wrong between ``name`` and the store now."""
        return (
            not self.answers(name)
            or bool(self.errors.get(name))
            or bool(self.lost_writes.get(name))
        )

    def clear(self) -> None:
        self.quorum_lost = False
        self.cut.clear()
        self.errors.clear()
        self.lost_writes.clear()
        self.pause_after_claim.clear()


class LinkedStore:
    """One controller's link to the site's store: ``MemoryStore`` behind the faults."""

    def __init__(
        self, name: str, inner: MemoryStore, faults: StoreFaults, life: Life, pause: Any
    ) -> None:
        self.site = inner.site
        self._name = name
        self._inner = inner
        self._faults = faults
        self._life = life
        self._pause = pause

    async def _reach(self, call: str) -> None:
        await self._life.check()
        if not self._faults.answers(self._name):
            await asyncio.sleep(REQUEST_TIMEOUT_S)
            raise StoreUnavailable(f"etcd: {call}: no endpoint answered (injected)")
        queued = self._faults.errors.get(self._name)
        if queued and (queued[0] is not LeadershipLost or call in LEASED):
            kind = queued.pop(0)
            raise kind(f"etcd: {call}: {SAID[kind]} (injected)")
        if call in WRITES and self._faults.lost_writes.get(self._name):
            self._faults.lost_writes[self._name] -= 1
            await asyncio.sleep(REQUEST_TIMEOUT_S)
            raise StoreUnavailable(f"etcd: {call}: lost on its way (injected)")

    async def campaign(self, candidate: Candidate, ttl_s: float) -> Term | Leader:
        await self._reach("campaign")
        return await self._inner.campaign(candidate, ttl_s)

    async def renew(self, term: Term) -> float:
        await self._reach("renew")
        return await self._inner.renew(term)

    async def resign(self, term: Term) -> None:
        await self._reach("resign")
        await self._inner.resign(term)

    async def leader(self) -> Leader | None:
        await self._reach("leader")
        return await self._inner.leader()

    async def record_run(self, term: Term, record: RunRecord) -> None:
        await self._reach("record_run")
        await self._inner.record_run(term, record)

    async def record_step(self, term: Term, run: RunId, mark: StepMark) -> None:
        await self._reach("record_step")
        await self._inner.record_step(term, run, mark)
        self._claimed([mark])

    async def record_steps(self, term: Term, marks: Any) -> None:
        await self._reach("record_steps")
        await self._inner.record_steps(term, marks)
        self._claimed([mark for _, mark in marks])

    def _claimed(self, marks: list[StepMark]) -> None:
        """A claim landed (a step marked running, nothing asked yet): the test may have asked
        to pause this controller right here, between the claim and its action."""
        claims = [m for m in marks if m.state is StepState.RUNNING and not m.asked]
        if claims and self._name in self._faults.pause_after_claim:
            self._faults.pause_after_claim.discard(self._name)
            self._pause()

    async def forget_run(self, term: Term, run: RunId) -> None:
        await self._reach("forget_run")
        await self._inner.forget_run(term, run)

    async def record_owed(self, term: Term, owed: OwedCaches) -> None:
        await self._reach("record_owed")
        await self._inner.record_owed(term, owed)

    async def declare_alone(self, term: Term, notice: AloneNotice) -> None:
        await self._reach("declare_alone")
        await self._inner.declare_alone(term, notice)

    async def exchange_views(self, view: ControllerView, ttl_s: float) -> list[ControllerView]:
        await self._reach("exchange_views")
        return await self._inner.exchange_views(view, ttl_s)

    async def snapshot(self) -> SharedLedger:
        await self._reach("snapshot")
        return await self._inner.snapshot()

    async def wait_for_change(self, after_revision: int, within_s: float) -> bool:
        await self._life.check()
        if not self._faults.answers(self._name):
            await asyncio.sleep(min(within_s, REQUEST_TIMEOUT_S))
            raise StoreUnavailable("etcd: watch: no endpoint answered (injected)")
        return await self._inner.wait_for_change(after_revision, within_s)

    async def probe(self) -> list[EndpointHealth]:
        answered = self._faults.answers(self._name)
        return [EndpointHealth("memory", answered=answered)]

    async def close(self) -> None:
        await self._inner.close()


class PairLab(OutageLab):
    """The lab's world with two controllers and their store (see the module's docstring)."""

    def __init__(self, tmp: Path) -> None:
        self.faults = StoreFaults()
        self._store_site: MemorySite | None = None
        self.paused: dict[str, float] = {}
        """The controllers paused now, and since when."""
        self._unfenced: set[int] = set()
        """The requests (indexes in ``seen``) made while a controller went on alone."""
        self._trouble_at = 0.0
        """When something last stood between a controller and the store."""
        self._alone_idle: dict[str, float] = {}
        self._mains_since: dict[UpsName, float | None] = {}
        self._failed: set[int] = set()
        super().__init__(tmp, seats=[(name, pair_site(name)) for name in NAMES])
        self.faults.members_up = self._members_up
        # the two controllers' machines come in opposite orders in their plans (each stops
        # the other's before its own): their order is who acts, not a dependency
        for machines in (self._before, self._needs):
            for machine in self.machines:
                machines.get(machine, set()).difference_update(self.machines)
        self._mains_since = {u.name: 0.0 for u in self.site.ups}
        self._lab_task(self._sample())

    @property
    def store(self) -> MemorySite:
        if self._store_site is None:
            self._store_site = MemorySite(self.clock)
        return self._store_site

    def seat(self, name: str) -> Seat:
        return next(s for s in self.seats if s.name == name)

    def _store(self, seat: Seat, life: Life) -> StoreBuilder:
        def pause() -> None:
            self.pause(seat)

        return lambda site: LinkedStore(
            seat.name, MemoryStore(site.site, self.store), self.faults, life, pause
        )

    async def start(self, seat: Seat | None = None) -> None:
        seat = seat or self.seats[0]
        if seat.process is None:
            self.paused.pop(seat.name, None)  # a new process: the stopped one is gone
        await super().start(seat)
        process = seat.process
        if process is not None:
            pair = process.service.pair
            assert pair is not None, "the pair's site file has ha:"
            process.life.may_act = pair.may_act

    def _members_up(self) -> int:
        return sum(1 for m in STORE_MACHINES if self.all_in(m, PowerState.ON))

    # -- what the test does to the pair ----------------------------------------------------

    def pause(self, seat: Seat) -> None:
        """SIGSTOP: the process reaches nothing (platforms, UPSes, store) until woken."""
        if seat.process is not None and seat.process.life.awake.is_set():
            seat.process.life.awake.clear()
            self.paused[seat.name] = self.now

    def wake(self, seat: Seat) -> None:
        """SIGCONT."""
        self.paused.pop(seat.name, None)
        if seat.process is not None:
            seat.process.life.awake.set()

    def _clear_faults(self) -> None:
        super()._clear_faults()
        self.faults.clear()
        for seat in self.seats:
            seat.cut.clear()
            self.wake(seat)

    def _takeover_s(self) -> float:
        """The standby takes over a lease and a campaign after the leader went; without the
        store it goes on alone after twice the silence limit, and lags each step as long."""
        renew = TTL_S / 3
        standby_limit = 2 * (TTL_S + renew)
        return standby_limit + TTL_S + renew + standby_limit

    def _follows(self, service: Service) -> bool:
        """A controller that may not act holds the shared ledger's runs, which it follows;
        so does one that won the lease and has not taken the ledger's run up yet."""
        return service.pair is not None and (not service.pair.may_act() or service.taking_over)

    # -- the pair's rules, at each request -------------------------------------------------

    def _may_tell_again(self, process: int, run: str, ups: UpsName) -> bool:
        """Unless the sender read the first one's mark in the shared ledger: two
        controllers alone, or one that took the run over without reading the mark (the
        store silent), each send it (harmless, docs/ha.md)."""
        seat = self.seat_of(process)
        pair = seat.process.service.pair if seat is not None and seat.process else None
        seen = pair.seen if pair is not None else None
        return seen is None or ups_command_mark(ups) not in seen.steps_of(RunId(run))

    def _role(self, process: int) -> Role | None:
        seat = self.seat_of(process)
        if seat is None or seat.process is None or seat.process.service.pair is None:
            return None
        return seat.process.service.pair.leadership.role

    def _anyone_alone(self) -> bool:
        return any(
            s.process is not None
            and s.process.service.pair is not None
            and s.process.service.pair.leadership.alone
            for s in self.seats
        )

    def _may_ask_again(self, previous: Seen, seen: Seen) -> bool:
        """Without the store, two controllers alone may both ask (never missing a shutdown
        outranks never acting twice; docs/ha.md): a request made while one went on alone, or
        asked again after one."""
        index = next(i for i in range(len(self.seen) - 1, -1, -1) if self.seen[i] is previous)
        return self._anyone_alone() or index in self._unfenced

    def _check_request(self, seen: Seen) -> None:
        if self._anyone_alone():
            self._unfenced.add(len(self.seen))
        problem = self._without_lease(seen.process)
        if problem is not None:
            self.violations.append(f"{_said(seen)}: {problem}")

    def _without_lease(self, process: int) -> str | None:
        """A controller acting with the store holds the leader key on a lease the store has
        not ended; alone, the rule is the silence limit (``Leadership``'s)."""
        seat = self.seat_of(process)
        role = self._role(process)
        if seat is None or role is None or role is Role.ALONE:
            return None
        value = self.store.keys.get(LEADER)
        if value is None:
            return f"{seat.name} ({role.value}) acts while nobody holds the lease"
        holder = decode(Candidate, value.data).name
        lease = self.store.leases.get(value.lease) if value.lease is not None else None
        if holder != seat.name:
            return f"{seat.name} ({role.value}) acts while {holder} holds the lease"
        if lease is None or lease[1] <= self.now:
            return f"{seat.name} ({role.value}) acts on a lease the store has ended"
        return None

    def _heard(self, process: int, event: Event) -> None:
        super()._heard(process, event)
        if isinstance(event, UpsCommandSent) and event.ok:
            problem = self._without_lease(process)
            if problem is not None:
                self.violations.append(f"T+{self.now:.0f}s UPS {event.ups} commanded: {problem}")
        elif isinstance(event, RunStarted):
            self._check_on_mains(process, event)

    def _check_on_mains(self, process: int, event: RunStarted) -> None:
        """No policy's shutdown starts or resumes while every feed it concerns has been on
        mains a while, as this controller could read it (a UPS it cannot reach is no proof
        of mains)."""
        spec = event.spec
        if spec.kind is not RunKind.SHUTDOWN or spec.origin is not RunOrigin.POLICY:
            return
        seat = self.seat_of(process)
        feeds = [f for f in self.site.feeds if spec.feeds is None or f.name in spec.feeds]
        upses = {u for f in feeds for u in f.ups}
        if seat is None or not feeds or upses & seat.cut:
            return
        self._sample_mains()  # the mains may have failed this instant, after the last sample
        since = [self._mains_since.get(u) for u in upses]
        if all(s is not None and self.now - s >= MAINS_FOR_S for s in since):
            what = "resumed" if event.resumed else "started"
            self.violations.append(
                f"T+{self.now:.0f}s {seat.name}: shutdown {spec.id} {what} while "
                f"{', '.join(sorted(upses))} on mains for {MAINS_FOR_S:.0f}s and more"
            )

    # -- the pair's rules over time ----------------------------------------------------------

    async def _sample(self) -> None:
        while True:
            self._sample_once()
            await asyncio.sleep(SAMPLE_S)

    def _sample_once(self) -> None:
        self._sample_mains()
        if any(self.faults.broken_for(s.name) for s in self.seats) or self.paused:
            self._trouble_at = self.now
        self._check_one_actor()

    def _sample_mains(self) -> None:
        """Since when each UPS has read steady mains (None: not now), as of this instant."""
        power = self.power
        for ups in self._mains_since:
            steady = (
                power.mains[ups]
                and power.link[ups] is LinkState.OK
                and not power.fsd[ups]
                and not power.self_test[ups]
            )
            if not steady:
                self._mains_since[ups] = None
            elif self._mains_since[ups] is None:
                self._mains_since[ups] = self.now
        for seat in self.seats:
            self._check_rejoins(seat)
            self._check_loops(seat)

    def _check_one_actor(self) -> None:
        """A lease after the store answers both again (and nobody is paused), at most one
        controller may act."""
        if self.now - self._trouble_at < TTL_S:
            return
        acting = [
            s.name
            for s in self.seats
            if s.serving is not None
            and s.serving.service.pair is not None
            and s.serving.service.pair.may_act()
        ]
        if len(acting) > 1:
            self._trouble_at = self.now  # said once for this time both may act
            self.violations.append(
                f"T+{self.now:.0f}s: {' and '.join(acting)} may both act, "
                f"{self.now - self._trouble_at:.0f}s after the store answered both again"
            )

    def _check_rejoins(self, seat: Seat) -> None:
        """Alone with its run over while the store answers it: back in the pair by its next
        polls (its leadership loop hears the store within a third of a lease)."""
        process = seat.serving
        pair = process.service.pair if process is not None else None
        if (
            process is None
            or pair is None
            or not pair.leadership.alone
            or process.service.controller.busy
            or self.faults.broken_for(seat.name)
            or seat.name in self.paused
        ):
            self._alone_idle.pop(seat.name, None)
            return
        since = self._alone_idle.setdefault(seat.name, self.now)
        poll = self.site.policies.poll_interval.total_seconds()
        if self.now - since > TTL_S / 3 + 2 * poll + SAMPLE_S:
            self.violations.append(
                f"T+{self.now:.0f}s: {seat.name} still alone {self.now - since:.0f}s after its "
                "run ended, the store answering"
            )
            self._alone_idle.pop(seat.name, None)

    def _check_loops(self, seat: Seat) -> None:
        process = seat.serving
        if process is None or process.number in self._failed:
            return
        failed = process.service.failed
        if failed is not None:
            self._failed.add(process.number)
            self.violations.append(f"T+{self.now:.0f}s {seat.name}: a loop died: {failed}")


__all__ = ["ERRORS", "MACHINES", "NAMES", "PairLab", "StoreFaults", "pair_site"]
