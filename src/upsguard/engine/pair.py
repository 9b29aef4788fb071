"""The engine's side of a controller pair: what the leader writes, the fence before each
step, and what the standby follows.

``Leadership`` (``engine.leadership``) says who may act; this module makes the engine
honour it and keeps the shared ledger:

* every change of a run record (the ``RunLedger``'s ``LedgerSink``) and every step's state
  and requests under way (the ``StepFinished`` and ``TargetAsked`` events) is written to
  the store, in order, by one writer task, fenced by the leader's term. A run that ends
  ``interrupted`` is not written as ended: the store keeps it in progress for whichever
  controller leads next;
* before a step acts, ``claim`` records it started, fenced, behind every write before it.
  A leader that cannot renew (``fenced``) waits there: its lease may come back; a leader
  deposed is refused, and its step ends interrupted;
* step marks queued one after another (a thousand VMs' claims at the start of a shutdown,
  their requests right after) go to the store together, in one fenced write of up to
  ``MAX_MARKS``: the order holds (a transaction applies all of it or nothing), and a step
  start costs etcd a share of one round trip instead of a whole one in a queue;
* before the first step that stops a machine carrying an etcd member (``ha.store_machines``)
  past what the store's quorum survives, the leader finishes alone;
* the standby reads the whole ledger at one revision and waits for the next change
  (``follow``); the controller that wins the lease resumes the run it holds.

When the store is silent while a shutdown must go on, the rule is ``Leadership``'s: never
missing a shutdown outranks never acting twice (see ``act_alone``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from upsguard.clock import Clock
from upsguard.engine.actions import UnderWay
from upsguard.engine.leadership import RETRY_WRITE_S, Leadership, LeadershipState, Role
from upsguard.errors import AuthenticationError, LeadershipLost, StoreUnavailable, UpsguardError
from upsguard.events import (
    CacheModeChanged,
    Event,
    RequestFailed,
    StepFinished,
    TargetAsked,
    UpsCommandSent,
)
from upsguard.models import (
    CacheMode,
    PlatformName,
    ResourceId,
    RunId,
    StepId,
    StepState,
    Target,
    UpsName,
)
from upsguard.plugins.coordination.base import (
    MAX_MARKS,
    AskedTarget,
    ControllerView,
    CoordinationStore,
    OwedCaches,
    SharedLedger,
    StepMark,
    UpsSeen,
    commanded_ups,
    ups_command_mark,
)
from upsguard.runs import RunKind, RunRecord, RunSpec

log = logging.getLogger(__name__)

T = TypeVar("T")

FENCED_WAIT_S = 0.1
"""How often a step waiting at a fenced leader's claim looks again at the role."""

Write = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class StepWrite:
    """One step's state for the shared ledger, written with the step marks queued beside it.
    ``claimed``: the step's claim (its start, before it acts), told whether it may act."""

    run: RunId
    step: StepId
    state: StepState
    detail: str = ""
    asked: tuple[AskedTarget, ...] = ()
    claimed: asyncio.Future[bool] | None = None


@dataclass(frozen=True, slots=True)
class SharedRun:
    """A run the shared ledger holds in progress, as the controller that leads resumes it."""

    spec: RunSpec
    done: Mapping[StepId, StepState]
    """The steps finished (done or skipped), and how."""
    requests: tuple[UnderWay, ...]
    unsure: tuple[StepId, ...]
    """Steps marked started and not finished: re-checked against the real world."""
    running_by: Mapping[StepId, str] = field(default_factory=dict)
    """Who marked each step started and not finished (a controller stopping its own machine
    leaves its step so: it went down with it)."""
    told: Mapping[UpsName, datetime] = field(default_factory=dict)
    """The UPSes a leader was about to send the run's end command (``claim_ups_command``),
    and when: sent, or about to be, and not sent again."""


class Pair:
    """This controller's side of the pair, beside its ``Leadership``."""

    def __init__(
        self,
        leadership: Leadership,
        store: CoordinationStore,
        clock: Clock,
        *,
        members: int,
        store_machines: Collection[ResourceId] = (),
        views_store: CoordinationStore | None = None,
    ) -> None:
        """``members``: how many etcd members the store has; ``store_machines``: the
        resources whose stop takes one of them down; ``views_store``: the store's client the
        views are exchanged through, one of their own (a client that drops its connection
        to a member that does not answer would break the lease's renewal under way on it)."""
        self.leadership = leadership
        self.store = store
        self.views_store = views_store if views_store is not None else store
        self._clock = clock
        self._members = members
        self._store_machines = frozenset(store_machines)
        self._queue: asyncio.Queue[Write | StepWrite] = asyncio.Queue()
        self._asked: dict[tuple[RunId, StepId], tuple[AskedTarget, ...]] = {}
        self._handed: set[RunId] = set()
        self._given_back: set[RunId] = set()
        self._taken: set[RunId] = set()
        self._gone: dict[RunId, set[ResourceId]] = {}
        self.seen: SharedLedger | None = None
        """The ledger as last read from the store (the standby's view)."""
        self.seen_at: float | None = None
        self._owed: set[str] = set()
        """The caches the leaders owe write-back, as this controller knows it: the ledger's
        as last read, and what it flipped or returned itself since."""
        self._took: set[str] = set()
        self.others: list[ControllerView] = []
        """The views the other controllers published, as last exchanged (``share_views``)."""
        self.others_at: float | None = None

    @property
    def me(self) -> str:
        return self.leadership.state().me

    # -- what may be done -------------------------------------------------------------------

    def may_act(self) -> bool:
        """Leading (or finishing alone), and no other controller said it finishes alone."""
        return self.leadership.may_act() and not self._alone_elsewhere()

    def _alone_elsewhere(self) -> bool:
        """The other controller said it finishes alone, and still holds that term."""
        seen = self.seen
        if seen is None or seen.alone is None or self.leadership.alone:
            return False
        return seen.alone.by != self.me and seen.alone.holds(seen.leader)

    def act_alone(self, reason: str) -> bool:
        """A shutdown must go on and this controller may not act: go on without the store
        once it has been silent long enough (``Leadership.act_without_store``); never
        after the other controller said it finishes alone."""
        if self._alone_elsewhere():
            return False
        return self.leadership.act_without_store(reason)

    def state(self) -> LeadershipState:
        return self.leadership.state()

    def rejoin(self) -> bool:
        """Finished alone, the run over (the caller's word): back to the pair once the store
        answers (``Leadership.rejoin``)."""
        return self.leadership.rejoin()

    def alone_lag_s(self) -> float | None:
        """``Unfenced``: without the store, the lag ``Leadership.alone_lag_s`` gives this
        controller; None while the store fences its steps."""
        return self.leadership.alone_lag_s if self.leadership.alone else None

    # -- the shared ledger: writes, in order ----------------------------------------------

    def changed(self, record: RunRecord) -> None:
        """``LedgerSink``: a run record changed. An interrupted run stays in progress in the
        store: the controller that leads next resumes it."""
        if record.outcome is not None and record.outcome.resumable:
            return
        self._enqueue(lambda: self.leadership.record_run(record))

    def forgotten(self, run: RunId) -> None:
        self._handed.discard(run)
        self._given_back.discard(run)
        self._taken.discard(run)
        self._gone.pop(run, None)
        self._enqueue(lambda: self.leadership.forget_run(run))

    @property
    def owed(self) -> frozenset[str]:
        return frozenset(self._owed)

    def take_debts(self) -> list[str]:
        """Leading: the caches the others owe write-back and may not return themselves, not
        taken over yet. Taken now: this controller owes them from here on (so does the
        shared ledger), and says so in its view until the others no longer list them."""
        owed_elsewhere = {c for view in self.others for c in view.owes}
        self._took &= owed_elsewhere
        new = sorted(owed_elsewhere - self._took)
        if new:
            self._took.update(new)
            self._owed.update(new)
            self.share_owed()  # in the ledger too: the next leader owes them if this one dies
        return new

    def debts_taken(self) -> set[str]:
        """Not leading: the caches the leader said it took over from this controller."""
        return {c for view in self.others for c in view.took}

    def share_owed(self) -> None:
        """Write the caches owed write-back as this controller knows them (on leading again,
        after writes made alone were dropped)."""
        owed = OwedCaches(tuple(sorted(self._owed)))
        self._enqueue(lambda: self.leadership.record_owed(owed))

    def observe(self, event: Event) -> None:
        """Subscribed to the event bus: each step's end, each request a platform took, and
        each cache taken out of write-back or returned to it (the next leader owes it)."""
        if isinstance(event, CacheModeChanged) and event.ok:
            before = set(self._owed)
            if event.owed:
                self._owed.add(event.cache)
            elif event.mode is CacheMode.WRITE_BACK:
                self._owed.discard(event.cache)
            if self._owed != before:
                self.share_owed()
        elif isinstance(event, TargetAsked):
            key = (event.run, event.step)
            target = AskedTarget(event.platform, event.target_kind, event.target, event.wanted)
            kept = tuple(a for a in self._asked.get(key, ()) if a.name != target.name)
            mark = self._asked[key] = (*kept, target)
            self._enqueue(StepWrite(event.run, event.step, StepState.RUNNING, asked=mark))
        elif isinstance(event, UpsCommandSent) and not event.ok and event.run is not None:
            self._ups_command_failed(RunId(event.run), UpsName(event.ups))
        elif isinstance(event, RequestFailed):  # no longer under way: the next leader asks
            key = (event.run, event.step)
            self._asked[key] = tuple(a for a in self._asked.get(key, ()) if a.name != event.target)
        elif isinstance(event, StepFinished):
            held = self._asked.pop((event.run, event.step), ())
            left = () if event.state is StepState.DONE else held
            if event.state is StepState.DONE and event.resource is not None:
                self._gone.setdefault(event.run, set()).add(event.resource)
            self._enqueue(StepWrite(event.run, event.step, event.state, event.detail, left))

    def _enqueue(self, write: Write | StepWrite) -> None:
        if self.leadership.role is not Role.STANDBY:  # a standby has nothing to write
            self._queue.put_nowait(write)

    async def write_in_order(self) -> None:
        """The writer task: the writes in the order they were made, step marks queued one
        after another together. A write the store refuses (deposed) or does not answer is
        dropped: the next leader re-checks the real world for what the ledger lacks."""
        waiting: deque[Write | StepWrite] = deque()
        while True:
            if not waiting:
                waiting.append(await self._queue.get())
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            write = waiting.popleft()
            if isinstance(write, StepWrite):
                batch = [write]
                while waiting and len(batch) < MAX_MARKS:
                    follows = waiting[0]
                    if not isinstance(follows, StepWrite):
                        break
                    batch.append(follows)
                    waiting.popleft()
                await self._write_steps(batch)
                continue
            try:
                await write()
            except (LeadershipLost, StoreUnavailable, AuthenticationError) as exc:
                log.info("shared ledger: a write was not made: %s", exc)
            except Exception:  # a bug here must not stop the writes after it
                log.exception("shared ledger: a write failed")

    async def _write_steps(self, batch: list[StepWrite]) -> None:
        """One fenced write of ``batch``; its claims are told whether their steps may act
        (``Leadership.claim_step``'s rule: while a claim waits, a store that does not answer
        is asked again until the fence). Without a claim, marks not written are dropped."""
        claims = [w.claimed for w in batch if w.claimed is not None]
        # one mark per step, its newest: a transaction may not put one key twice (etcd)
        newest = {(w.run, w.step): w for w in batch}
        marks = [
            (w.run, self.leadership.mark(w.step, w.state, w.detail, asked=w.asked))
            for w in newest.values()
        ]
        try:
            await self._write_marks(marks, retry=bool(claims))
        except (LeadershipLost, StoreUnavailable) as exc:
            log.info("shared ledger: %d step mark(s) not written: %s", len(marks), exc)
            self._tell(claims, False)
        except Exception as exc:  # the claims' callers get it; the writes after it go on
            if not claims:
                log.exception("shared ledger: a write failed")
            for claimed in claims:
                if not claimed.done():
                    claimed.set_exception(exc)
        else:
            self._tell(claims, True)

    async def _write_marks(self, marks: list[tuple[RunId, StepMark]], *, retry: bool) -> None:
        """``retry``: a claim waits on it, so a silent store is asked again (until the fence,
        where ``record_steps`` says this controller does not lead)."""
        while True:
            try:
                await self.leadership.record_steps(marks)
                return
            except StoreUnavailable as exc:
                if not retry:
                    raise
                log.debug("shared ledger: claims not written yet: %s", exc)
            await asyncio.sleep(RETRY_WRITE_S)

    @staticmethod
    def _tell(claims: list[asyncio.Future[bool]], may_act: bool) -> None:
        for claimed in claims:
            if not claimed.done():
                claimed.set_result(may_act)

    async def _in_order(self, job: Callable[[], Awaitable[T]]) -> T:
        """``job`` run by the writer, after every write queued before it."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        async def run() -> None:
            try:
                done.set_result(await job())
            except BaseException as exc:
                done.set_exception(exc)
                raise

        self._queue.put_nowait(run)
        return await done

    # -- before a step acts ---------------------------------------------------------------

    async def claim(self, spec: RunSpec, step: StepId, resource: ResourceId | None) -> bool:
        """Record ``step`` started, fenced; True: act. A fenced leader waits here (a renewal
        may still land; a shutdown goes on alone once the store has been silent too long);
        False once another controller leads."""
        while True:
            if self._alone_elsewhere():
                return False
            role = self.leadership.role
            if role is Role.ALONE:
                return True
            if role is Role.STANDBY:
                return False
            if role is Role.LEADER:
                await self._before_store_machine(spec, resource)
                if self.leadership.role is Role.ALONE:
                    return True
                claimed = asyncio.get_running_loop().create_future()
                self._queue.put_nowait(StepWrite(spec.id, step, StepState.RUNNING, claimed=claimed))
                if await claimed:
                    return True
                continue
            if spec.kind is RunKind.SHUTDOWN and self.act_alone(f"run {spec.id} must go on"):
                return True
            await asyncio.sleep(FENCED_WAIT_S)

    async def claim_ups_command(self, spec: RunSpec, ups: UpsName) -> bool:
        """``claim``, before the end command of ``spec`` goes to ``ups``: the mark it leaves
        in the ledger tells the controller that leads next that the UPS was told. Marked
        first and sent after, a leader that dies between the two leaves a UPS untold (its
        battery then runs out, and the UPS powers up with the mains), never told twice.
        Finishing alone (the end of an outage usually is: the store's machines go down),
        the mark is written while the store still answers, and the command goes out
        whether it was or not."""
        mark = ups_command_mark(ups)
        if self.leadership.role is not Role.ALONE:
            return await self.claim(spec, mark, None)
        told = self.leadership.mark(mark, StepState.RUNNING)
        with contextlib.suppress(LeadershipLost, StoreUnavailable, AuthenticationError):
            await self._in_order(lambda: self.leadership.record_ups_command(spec.id, told))
        return True

    def _ups_command_failed(self, run: RunId, ups: UpsName) -> None:
        """The UPS refused its end command (or did not answer): its mark says so (written
        also while finishing alone), and the next leader sends it again."""
        failed = self.leadership.mark(ups_command_mark(ups), StepState.FAILED)
        if self.leadership.role is not Role.STANDBY:
            self._queue.put_nowait(lambda: self.leadership.record_ups_command(run, failed))

    async def _before_store_machine(self, spec: RunSpec, resource: ResourceId | None) -> None:
        """Stopping ``resource`` takes an etcd member down: when the members left would be
        fewer than a quorum, the leader finishes alone first (noted in the store, so no
        standby takes over after this point)."""
        if resource not in self._store_machines or spec.kind is not RunKind.SHUTDOWN:
            return
        gone = self._gone.setdefault(spec.id, set()) & self._store_machines
        left = self._members - len(gone | {resource})
        if left >= self._members // 2 + 1:
            return
        reason = (
            f"stopping {resource} leaves {left} of the store's {self._members} etcd members, "
            "too few for a quorum"
        )
        await self._in_order(lambda: self._finish_alone(reason))

    async def _finish_alone(self, reason: str) -> None:
        await self.leadership.finish_alone(reason)

    # -- handing over ---------------------------------------------------------------------

    def should_hand_over(self, run: RunId) -> bool:
        """At the first of the two controllers' machines: the leader hands the run over once
        (the other then stops this machine and its own last), unless it finishes alone, or
        took the run over from the other (which died, or lost its lease: it would not be
        there to take it back)."""
        return (
            self.leadership.role is Role.LEADER
            and run not in self._handed
            and run not in self._taken
        )

    def should_hand_back(self, run: RunId) -> bool:
        """The run was handed over to this controller, which cannot carry out its end (it
        cannot read a UPS the end of the outage commands): it hands the run back, once per
        run, so two controllers that both cannot never pass it to and fro. The controller
        that handed it over was alive a moment ago and wins again once its quiet after the
        handover ends, a lease before this one campaigns (``Leadership.hand_over``); were it
        gone since, this one wins again then and goes on."""
        return (
            self.leadership.role is Role.LEADER
            and run in self._handed
            and run not in self._given_back
        )

    async def hand_back(self, spec: RunSpec, step: StepId) -> None:
        """``hand_over``, for a run this controller was handed (``should_hand_back``)."""
        self._given_back.add(spec.id)
        await self.hand_over(spec, step, back=True)

    async def hand_over(self, spec: RunSpec, step: StepId, *, back: bool = False) -> None:
        """Note the handover at ``step`` in the store, fenced, then end this term at once:
        the other controller wins now instead of after the lease."""
        self._handed.add(spec.id)
        detail = f"{self.me} handed the run over: the other controller finishes it"
        with contextlib.suppress(LeadershipLost, StoreUnavailable, AuthenticationError):
            await self._in_order(
                lambda: self.leadership.record_step(
                    spec.id, step, StepState.INTERRUPTED, detail, handed_over=True
                )
            )
        await self.leadership.hand_over(back=back)

    # -- following and taking over ---------------------------------------------------------

    async def follow(self, on_ledger: Callable[[SharedLedger], None]) -> None:
        """While standby: read the ledger, give it to ``on_ledger``, wait for the next change;
        never raises (a silent store is waited out, and ``Leadership`` counts the silence)."""
        pause = self.leadership.renew_every_s
        while True:
            if self.leadership.role in (Role.LEADER, Role.ALONE):
                await asyncio.sleep(pause)
                continue
            try:
                ledger = await self.store.snapshot()
            except Exception as exc:  # silent or refusing: waited out, the loop lives on
                _not_read(exc, "following the shared ledger")
                await asyncio.sleep(pause)
                continue
            self._saw(ledger)
            if self.leadership.role not in (Role.LEADER, Role.ALONE):  # it may lead by now
                on_ledger(ledger)
            try:
                await self.store.wait_for_change(ledger.revision, 3 * pause)
            except Exception as exc:
                _not_read(exc, "following the shared ledger")
                await asyncio.sleep(pause)

    async def share_views(
        self, reading: Callable[[], Sequence[UpsSeen]], owes: Callable[[], Collection[str]]
    ) -> None:
        """Leader or not: publish what this controller reads of the UPSes and the debts of
        write-back it passes on or took over, and keep what the others published
        (``others``, read at ``others_at``), every renewal period; never raises (a silent
        store is waited out, and the others' views then age)."""
        pause = self.leadership.renew_every_s
        while True:
            role = self.leadership.role
            view = ControllerView(
                self.me,
                role.value,
                self._clock.now(),
                tuple(reading()),
                owes=() if self.may_act() else tuple(sorted(owes())),
                took=tuple(sorted(self._took)),
            )
            try:
                self.others = await self.views_store.exchange_views(view, 3 * pause)
            except Exception as exc:
                _not_read(exc, "sharing the controllers' views")
            else:
                self.others_at = self._clock.monotonic()
            await asyncio.sleep(pause)

    async def latest(self) -> SharedLedger | None:
        """The ledger as the store holds it now (on winning); the one seen last when the
        store does not answer."""
        try:
            ledger = await self.store.snapshot()
        except Exception as exc:
            _not_read(exc, "reading the shared ledger")
            log.warning("reading the shared ledger: %s (using the one seen last)", exc)
            return self.seen
        self._saw(ledger)
        return ledger

    def _saw(self, ledger: SharedLedger) -> None:
        self.seen, self.seen_at = ledger, self._clock.monotonic()
        self._owed = set(ledger.owed)

    def shared_run(self, ledger: SharedLedger | None = None) -> SharedRun | None:
        """The run in progress in ``ledger`` (the one seen last), as a leader resumes it:
        steps done or skipped are not run again; requests under way are waited for. This
        controller finishes it itself (no handover back)."""
        ledger = ledger if ledger is not None else self.seen
        if ledger is None or ledger.active is None:
            return None
        spec = ledger.active.spec
        self._taken.add(spec.id)
        marks = {s: m for s, m in ledger.steps_of(spec.id).items() if commanded_ups(s) is None}
        told = {
            UpsName(u): m.at
            for s, m in ledger.steps_of(spec.id).items()
            if (u := commanded_ups(s)) and m.state is not StepState.FAILED
        }
        done = {s: m.state for s, m in marks.items() if m.state.finished}
        if ledger.handed_over(spec.id) is not None:
            self._handed.add(spec.id)
        requests = tuple(
            UnderWay(
                spec.id,
                step,
                Target(PlatformName(a.platform), a.kind, a.name),
                a.wanted,
            )
            for step, mark in marks.items()
            if not mark.state.finished
            for a in mark.asked
        )
        unsure = tuple(sorted(s for s, m in marks.items() if not m.state.finished))
        running = {s: m.by for s, m in marks.items() if m.state is StepState.RUNNING}
        return SharedRun(spec, done, requests, unsure, running, told)

    def gone(self, run: RunId, resources: Collection[ResourceId]) -> None:
        """Machines a resumed run's done steps stopped (for the store's quorum)."""
        self._gone.setdefault(run, set()).update(resources)


def _not_read(exc: Exception, doing: str) -> None:
    """The store could not be read while ``doing``: silent or refusing is expected (it is
    waited out); anything else is a bug of the client, logged in full."""
    if isinstance(exc, UpsguardError):
        log.debug("%s: %s", doing, exc)
    else:
        log.error("%s: the store's client failed", doing, exc_info=exc)
