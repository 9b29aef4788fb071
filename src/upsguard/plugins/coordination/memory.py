"""An in-memory coordination store: the shipped test double, and the simulator's.

It behaves as etcd does for everything ``CoordinationStore`` promises, and that is checked,
not assumed: the contract tests that run against three real etcd members
(``tests/integration/test_coordination_store.py``) run against it too. One revision counts
every change; a lease ends ``ttl`` seconds after its grant or last renewal on the injected
clock's monotonic time (so under the simulator's virtual clock leases end in virtual time);
the leader key's mod revision is the fencing token; a fenced write is applied only while
it matches. Several ``MemoryStore``s that share one ``MemorySite`` are the controllers of
a pair. What it cannot show is a store that fails: tests wrap it for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from upsguard.clock import Clock
from upsguard.errors import LeadershipLost
from upsguard.models import RunId, StepId
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
)
from upsguard.plugins.coordination.records import decode, encode
from upsguard.runs import RunRecord

LEADER, ALONE, OWED = "leader", "alone", "owed"
VIEWS = "views/"
"""Where each controller's view is kept, beside the ledger (``exchange_views``)."""


LEASE_TICK_S = 0.001
"""The shortest wait for a lease's end. The site's clock and the loop's differ by the site
clock's start: a lease ending a hair after now, by less than the loop's clock can add to its
own time, would be waited for with no wait at all, over and over, the clock never moving."""


@dataclass
class _Value:
    data: bytes
    create_revision: int
    mod_revision: int
    lease: int | None = None


@dataclass
class MemorySite:
    """What a site's store holds; shared by the stores of both controllers."""

    clock: Clock
    revision: int = 1
    keys: dict[str, _Value] = field(default_factory=dict)
    leases: dict[int, tuple[float, float]] = field(default_factory=dict)  # id: (ttl, ends at)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def expire(self) -> None:
        """Leases past their end go, and their keys with them (as etcd's lessor does)."""
        now = self.clock.monotonic()
        for lease, (_, ends) in list(self.leases.items()):
            if ends <= now:
                self.revoke(lease)

    def next_end(self) -> float | None:
        return min((ends for _, ends in self.leases.values()), default=None)

    def grant(self, ttl: float) -> int:
        lease = next(self._ids)
        self.leases[lease] = (ttl, self.clock.monotonic() + ttl)
        return lease

    def revoke(self, lease: int) -> bool:
        if self.leases.pop(lease, None) is None:
            return False
        held = [k for k, v in self.keys.items() if v.lease == lease]
        if held:
            self.change(lambda: [self.keys.pop(k) for k in held])
        return True

    def put(self, key: str, data: bytes, lease: int | None = None) -> None:
        """Within ``change``: one revision for everything a transaction writes."""
        old = self.keys.get(key)
        created = old.create_revision if old is not None else self.revision
        self.keys[key] = _Value(data, created, self.revision, lease)

    def change(self, apply: Callable[[], object]) -> None:
        self.revision += 1
        apply()
        self._changed.set()
        self._changed = asyncio.Event()

    def mod_revision(self, key: str) -> int:
        value = self.keys.get(key)
        return value.mod_revision if value is not None else 0

    async def changed_after(self, revision: int, within_s: float) -> bool:
        """A lease ending is a change too: the wait wakes for the next one to end."""
        loop = asyncio.get_running_loop()
        until = loop.time() + within_s
        while True:
            self.expire()
            if self.revision > revision:
                return True
            wait = until - loop.time()
            if wait <= 0:
                return False
            ends = self.next_end()
            if ends is not None:  # at least a tick: a hair's wait may not move the loop's clock
                wait = min(wait, max(LEASE_TICK_S, ends - self.clock.monotonic()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._changed.wait()


class MemoryStore:
    """One controller's view of a ``MemorySite``."""

    def __init__(self, site: str, shared: MemorySite) -> None:
        self.site = site
        self._shared = shared
        self._view_lease: int | None = None

    async def campaign(self, candidate: Candidate, ttl_s: float) -> Term | Leader:
        s = self._now()
        if LEADER in s.keys:
            leader = self._leader()
            assert leader is not None
            return leader
        lease = s.grant(ttl_s)
        s.change(lambda: s.put(LEADER, encode(candidate), lease))
        return Term(candidate, s.mod_revision(LEADER), lease, ttl_s)

    async def renew(self, term: Term) -> float:
        s = self._now()
        if term.lease not in s.leases:
            raise LeadershipLost(f"memory: the lease of term {term.token} has ended")
        ttl, _ = s.leases[term.lease]
        s.leases[term.lease] = (ttl, s.clock.monotonic() + ttl)
        return ttl

    async def resign(self, term: Term) -> None:
        self._now().revoke(term.lease)

    async def leader(self) -> Leader | None:
        self._now()
        return self._leader()

    async def record_run(self, term: Term, record: RunRecord) -> None:
        data = encode(record)
        self._fenced(
            term, f"record run {record.spec.id}", lambda s: s.put(_run(record.spec.id), data)
        )

    async def record_step(self, term: Term, run: RunId, mark: StepMark) -> None:
        data = encode(mark)
        self._fenced(term, f"record step {mark.step}", lambda s: s.put(_step(run, mark.step), data))

    async def record_steps(self, term: Term, marks: Sequence[tuple[RunId, StepMark]]) -> None:
        puts = [(_step(run, mark.step), encode(mark)) for run, mark in marks]

        def put_all(s: MemorySite) -> None:
            for key, data in puts:
                s.put(key, data)

        self._fenced(term, f"record {len(marks)} step(s)", put_all)

    async def forget_run(self, term: Term, run: RunId) -> None:
        def forget(s: MemorySite) -> None:
            for key in [k for k in s.keys if k == _run(run) or k.startswith(_step(run, ""))]:
                del s.keys[key]

        self._fenced(term, f"forget run {run}", forget)

    async def record_owed(self, term: Term, owed: OwedCaches) -> None:
        data = encode(owed)
        self._fenced(term, "record the caches owed write-back", lambda s: s.put(OWED, data))

    async def declare_alone(self, term: Term, notice: AloneNotice) -> None:
        data = encode(notice)
        self._fenced(term, "declare finishing alone", lambda s: s.put(ALONE, data))

    async def exchange_views(self, view: ControllerView, ttl_s: float) -> list[ControllerView]:
        s = self._now()
        lease = self._view_lease
        if lease is None or lease not in s.leases:
            lease = self._view_lease = s.grant(ttl_s)
        s.leases[lease] = (ttl_s, s.clock.monotonic() + ttl_s)
        mine, data = _view(view.by), encode(view)
        s.change(lambda: s.put(mine, data, lease))
        return [
            decode(ControllerView, v.data)
            for k, v in sorted(s.keys.items())
            if k.startswith(VIEWS) and k != mine
        ]

    async def snapshot(self) -> SharedLedger:
        s = self._now()
        runs = sorted(
            (
                (v.create_revision, decode(RunRecord, v.data))
                for k, v in s.keys.items()
                if k.startswith("runs/")
            ),
            key=lambda pair: pair[0],
        )
        steps: dict[RunId, dict[StepId, StepMark]] = {}
        for key, value in s.keys.items():
            if key.startswith("steps/"):
                run = RunId(unquote(key.split("/")[1]))
                mark = decode(StepMark, value.data)
                steps.setdefault(run, {})[mark.step] = mark
        alone = decode(AloneNotice, s.keys[ALONE].data) if ALONE in s.keys else None
        owed = decode(OwedCaches, s.keys[OWED].data).caches if OWED in s.keys else ()
        return SharedLedger(
            s.revision, self._leader(), tuple(r for _, r in runs), steps, alone, owed=owed
        )

    async def wait_for_change(self, after_revision: int, within_s: float) -> bool:
        return await self._shared.changed_after(after_revision, within_s)

    async def probe(self) -> list[EndpointHealth]:
        return [EndpointHealth("memory", answered=True, version="memory", is_leader=True)]

    async def close(self) -> None:
        return None

    def _now(self) -> MemorySite:
        self._shared.expire()
        return self._shared

    def _leader(self) -> Leader | None:
        value = self._shared.keys.get(LEADER)
        if value is None:
            return None
        return Leader(decode(Candidate, value.data), value.mod_revision)

    def _fenced(self, term: Term, what: str, write: Callable[[MemorySite], None]) -> None:
        s = self._now()
        if s.mod_revision(LEADER) != term.token:
            leader = self._leader()
            now = f"{leader.holder.name} leads now" if leader else "nobody leads now"
            raise LeadershipLost(
                f"memory: {what}: refused, the term {term.token} is over: {now}",
                leader=leader.holder.name if leader else None,
            )
        s.change(lambda: write(s))


def _run(run: RunId) -> str:
    return f"runs/{quote(run, safe='')}"


def _view(name: str) -> str:
    return f"{VIEWS}{quote(name, safe='')}"


def _step(run: RunId, step: str) -> str:
    return f"steps/{quote(run, safe='')}/{quote(step, safe='')}"
