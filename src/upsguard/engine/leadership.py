"""Leadership of a controller pair: win and keep the lease, and fence oneself in time.

``Leadership.run`` campaigns while this controller is a standby and renews the lease every
third of its TTL while it leads. It never trusts the store to say that the term is over:
a renewal is counted from the moment it was *sent* (the store restarts the lease at some
point after that), so the lease cannot end before ``sent + ttl``, and this controller stops
starting new actions at ``sent + ttl - fence_margin`` on the loop's monotonic clock unless
a later renewal succeeds. ``may_act`` reads the clock itself, so a process that was paused
(SIGSTOP) past its lease starts nothing when it wakes, before any renewal has failed; and
its fenced writes would be refused by the store anyway.

When the store cannot be reached the rule is: never missing a shutdown outranks never
acting twice (every step reads the real state first, so a repeated action is harmless;
a missed shutdown is not). A controller that needs to act while the store has been silent
for a lease and one renewal more (``silence_limit_s``) goes on alone
(``act_without_store``); so does a leader that knows the store is about to go down with its
machines (``finish_alone``, which leaves a notice in the store so that no standby takes
over after it). docs/ha.md tells each failure.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from upsguard.clock import Clock
from upsguard.errors import LeadershipLost, StoreUnavailable, UpsguardError
from upsguard.models import RunId, StepId, StepState
from upsguard.plugins.coordination.base import (
    AloneNotice,
    AskedTarget,
    Candidate,
    CoordinationStore,
    Leader,
    OwedCaches,
    StepMark,
    Term,
)
from upsguard.runs import RunRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_WRITE_S = 0.2
"""How soon a write the store did not answer is tried again, while the lease allows."""


async def within(seconds: float, call: Awaitable[T]) -> T:
    """``call``'s answer, or ``TimeoutError`` after ``seconds`` whether or not the call ends
    when cancelled. A store's client may swallow a cancellation (a gRPC stream on a channel
    another task closed), and ``asyncio.timeout`` then waits for it as long as it hangs: the
    fence, the silence that lets a controller go on alone, and every later renewal with it.
    Left behind (also when the caller is cancelled), the call is cancelled and its end
    collected quietly. A call that ended cancelled by itself (a cancellation leaking out of
    the client: a timeout of its own that fired as the call ended) got no answer either;
    passed on, that cancellation would end the caller's loop as if the service were
    stopping."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:  # the caller is stopping: the call is left behind too
        _leave_behind(task)
        raise
    if task in done:
        if task.cancelled():
            raise TimeoutError("the store's client cancelled its own call")
        return task.result()
    _leave_behind(task)
    raise TimeoutError(f"no answer within {seconds:.1f}s")


def _leave_behind(task: asyncio.Future[Any]) -> None:
    """Cancel a call no one waits for any more, and collect its end: an error never
    retrieved is logged whenever the garbage collector finds the task."""
    task.cancel()
    task.add_done_callback(_collect)


def _collect(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("a store call left behind ended: %s", task.exception())


class Role(enum.StrEnum):
    """What this controller of a pair may do now."""

    STANDBY = "standby"
    """Another controller leads, or nobody does and this one has not won yet: it starts
    nothing; it reads the UPSes and follows the shared ledger."""
    LEADER = "leader"
    """It holds the lease and renewed it in time: it may start actions, each recorded in
    the store under its term's token first."""
    FENCED = "fenced"
    """It held the lease but could not renew it in time: it starts nothing new. A renewal
    that still succeeds makes it the leader again (the lease never ended, so nobody else
    could have won); a lost lease makes it a standby."""
    ALONE = "finishing_alone"
    """It goes on without the store: the store's machines are going down, or the store was
    silent while an action was needed. It acts, and records only in its own journal."""


@dataclass(frozen=True, slots=True)
class LeadershipState:
    """What ``status``, metrics and the web page show of the pair, from this controller."""

    me: str
    role: Role
    leader: str | None
    """Who leads as last seen: this controller, the other one, or None (nobody, or unknown)."""
    token: int | None
    """The fencing token of the term this controller holds, or of the leader last seen."""
    lease_age_s: float | None
    """Since the last renewal (or the win) that succeeded was sent; None without a term."""
    ttl_s: float
    store_silent_s: float | None
    """Since a request to the store last failed with no answer after the last that did;
    None while the store answers."""
    detail: str = ""


class Leadership:
    """One controller's side of the pair: its term, its fence, and the writes it fences."""

    def __init__(
        self,
        store: CoordinationStore,
        me: Candidate,
        *,
        ttl_s: float,
        fence_margin_s: float,
        clock: Clock,
        on_change: Callable[[LeadershipState], None] | None = None,
    ) -> None:
        """``on_change``: told every change of role (to journal and notify it)."""
        if not 0 <= fence_margin_s < ttl_s / 2:
            raise ValueError("fence_margin_s must be less than half of ttl_s")
        self._store = store
        self._me = me
        self._ttl = ttl_s
        self._margin = fence_margin_s
        self._clock = clock
        self._on_change = on_change
        self.renew_every_s = ttl_s / 3
        self.silence_limit_s = ttl_s + self.renew_every_s
        self.standby_limit_s = 2 * self.silence_limit_s
        self._term: Term | None = None
        self._renewed_at: float | None = None  # when the last renewal that worked was sent
        self._seen: Leader | None = None
        self._silent_since: float | None = None
        self._alone: str | None = None
        self._declared = False
        """Alone by its own notice (``finish_alone``), not for the store's silence."""
        self._lag_s = 0.0
        self._quiet_until = float("-inf")  # no campaign before (after a handover)
        self._reported: Role | None = None
        self._detail = ""
        self._refusal: str | None = None
        """The store's last refusal, said once until it answers again."""

    # -- what may be done now ----------------------------------------------------------------

    @property
    def term(self) -> Term | None:
        return self._term

    @property
    def fence_at(self) -> float | None:
        """When this controller stops starting actions unless it renews first."""
        if self._renewed_at is None:
            return None
        return self._renewed_at + self._ttl - self._margin

    @property
    def role(self) -> Role:
        if self._alone is not None:
            return Role.ALONE
        if self._term is None:
            return Role.STANDBY
        fence = self.fence_at
        return Role.LEADER if fence is not None and self._clock.monotonic() < fence else Role.FENCED

    def may_act(self) -> bool:
        """Whether an action may start now; read from the clock, never from a stale flag."""
        return self.role in (Role.LEADER, Role.ALONE)

    def store_silent_s(self) -> float | None:
        if self._silent_since is None:
            return None
        return self._clock.monotonic() - self._silent_since

    def state(self) -> LeadershipState:
        role = self.role
        term = self._term
        leader = (
            self._me.name if term is not None else (self._seen.holder.name if self._seen else None)
        )
        token = term.token if term is not None else (self._seen.token if self._seen else None)
        age = (
            None
            if self._renewed_at is None or term is None
            else self._clock.monotonic() - self._renewed_at
        )
        return LeadershipState(
            self._me.name, role, leader, token, age, self._ttl, self.store_silent_s(), self._detail
        )

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Campaign or renew every third of the TTL until cancelled; store trouble becomes
        state (and ``on_change``), never an exception. Each attempt is bounded so that the
        fence is told on time even when the store hangs."""
        while True:
            started = self._clock.monotonic()
            await self._attempt()
            self._report()
            wake = started + self.renew_every_s
            fence = self.fence_at
            if self.role is Role.LEADER and fence is not None:
                wake = min(wake, fence)
            await asyncio.sleep(max(0.0, wake - self._clock.monotonic()))
            self._report()

    async def _attempt(self) -> None:
        if self._alone is not None:
            await self._renew_alone()
            return
        if self._term is None and self._clock.monotonic() < self._quiet_until:
            return
        bound = self.renew_every_s
        fence = self.fence_at
        if self._term is not None and fence is not None and self.role is Role.LEADER:
            bound = min(bound, fence - self._clock.monotonic())
        sent = self._clock.monotonic()
        try:
            term = self._term
            if term is None:
                await within(max(bound, 0.001), self._campaign(sent))
            else:
                await within(max(bound, 0.001), self._store.renew(term))
                self._renewed_at = sent
            self._answered()
        except LeadershipLost as exc:
            self._answered()
            self._lost(str(exc))
        except (StoreUnavailable, TimeoutError) as exc:
            self._silent(str(exc) or "no answer in time")
        except Exception as exc:  # a refusal or a client's bug: the loop lives on
            self._refused(exc)

    async def _renew_alone(self) -> None:
        """Finishing alone with a term: keep its lease while the store answers, so that a
        notice holds and no standby takes the run over.

        Alone because the store was silent, it rejoins as soon as the store answers, mid-run
        or not: it renews its term or campaigns, and leads on, or stops acting for the one
        who leads; two controllers alone must not go on side by side once they could agree.
        Alone because it said so (``finish_alone``: the store's machines are going down), it
        only asks who leads without a term, and rejoins once its run is over (``rejoin``)."""
        term = self._term
        sent = self._clock.monotonic()
        try:
            if term is not None:
                await within(self.renew_every_s, self._store.renew(term))
                self._renewed_at = sent
            elif self._declared:
                self._seen = await within(self.renew_every_s, self._store.leader())
            else:
                await within(self.renew_every_s, self._campaign(sent))
            self._answered()
        except LeadershipLost as exc:
            self._answered()
            self._lost(str(exc))
        except (StoreUnavailable, TimeoutError) as exc:
            self._silent(str(exc) or "no answer in time")
        except Exception as exc:
            self._refused(exc)
        if not self._declared and self._silent_since is None:
            self._alone, self._lag_s = None, 0.0
            self._detail = f"rejoined the pair: the store answers again; {self._detail}"

    async def _campaign(self, sent: float) -> None:
        won = await self._store.campaign(self._me, self._ttl)
        if isinstance(won, Term):
            self._term, self._renewed_at, self._seen = won, sent, won.leader
            self._detail = f"won the lease (term {won.token})"
        else:
            self._seen = won
            self._detail = f"{won.holder.name} leads (term {won.token})"

    def _lost(self, why: str) -> None:
        """The term is over; who leads now is learnt by the next campaign."""
        self._term = self._renewed_at = self._seen = None
        self._detail = why

    def _silent(self, why: str) -> None:
        if self._silent_since is None:
            self._silent_since = self._clock.monotonic()
        self._detail = f"the store does not answer: {why}"

    def _refused(self, exc: Exception) -> StoreUnavailable:
        """What etcd answers besides silence and a lost lease: a refused login or permission
        (a password rotated, a role changed), "revision of auth store is old", or an error
        of the client itself. None says whether the term holds, so each counts as the store
        not answering: the leader fences itself in time and a renewal that works later
        makes it the leader again. Said once as an error (with the traceback when it is no
        error of ours)."""
        why = str(exc) or type(exc).__name__
        if self._refusal != why:
            self._refusal = why
            if isinstance(exc, UpsguardError):
                log.error("leadership: the store refused %s: %s", self._me.name, why)
            else:
                log.error("leadership: the store's client failed", exc_info=exc)
        self._silent(f"refused: {why}")
        return StoreUnavailable(f"{self._me.name}: the store refused: {why}")

    def _answered(self) -> None:
        self._silent_since = None
        self._refusal = None

    def _report(self) -> None:
        role = self.role
        if role is not self._reported:
            self._reported = role
            state = self.state()
            log.warning("leadership: %s is %s: %s", state.me, role.value, state.detail)
            if self._on_change is not None:
                self._on_change(state)

    # -- handing over and going alone ----------------------------------------------------

    async def hand_over(self, *, back: bool = False) -> None:
        """End this term now (before this controller's machine stops): the other wins at
        once instead of after the lease. No campaign for a lease's time after it, or for
        two when handing ``back`` a run this controller was handed: the controller it goes
        back to, quiet since a moment before, must win first also when its campaign goes out
        late on a loaded machine (up to a third of a lease after its quiet, and as long for
        the answer); were it gone, this one goes on after the second lease."""
        term, self._term, self._renewed_at = self._term, None, None
        self._quiet_until = self._clock.monotonic() + self._ttl * (2 if back else 1)
        self._detail = "handed over"
        if term is not None:
            try:
                await self._store.resign(term)
            except StoreUnavailable as exc:  # the lease then ends by itself within its TTL
                self._silent(str(exc))
            except Exception as exc:  # likewise
                self._refused(exc)
        self._report()

    async def finish_alone(self, reason: str) -> bool:
        """The leader goes on without the store (its machines are about to stop): the notice
        is written, fenced, so no standby takes over after this point. Refused (False) when
        this controller does not lead; a store that does not answer does not stop it."""
        term = self._term
        if term is None or not self.may_act():
            return False
        notice = AloneNotice(self._me.name, term.token, self._clock.now(), reason)
        try:
            await self._store.declare_alone(term, notice)
        except LeadershipLost as exc:
            self._lost(str(exc))
            self._report()
            return False
        except StoreUnavailable as exc:
            self._silent(str(exc))
        except Exception as exc:  # refused: as silent, it does not stop the leader either
            self._refused(exc)
        self._go_alone(reason, declared=True)
        return True

    def act_without_store(self, reason: str) -> bool:
        """The rule for a store that cannot be reached while an action is needed (a shutdown
        must go on): after ``silence_limit_s`` of silence the controller that held the term
        goes on alone; a standby after twice that (``standby_limit_s``), so that a leader
        still alive is well ahead of it, and the standby finds the requests it made under
        way (a host's task, a guest shutting down) instead of asking again. Before that,
        False: a blip of the store is waited out.

        Alone, each target waits as long as that silence (``alone_lag_s``). A leader's
        lease is over by then, and it cannot tell a store that lost its quorum from one
        that only it cannot reach: the other controller may have won the lease and act
        through the store without lag, so the leader alone lags behind it by a silence
        limit, and the standby alone a silence limit behind a leader alone."""
        if self._alone is not None:
            return True
        silent = self.store_silent_s()
        limit = self.silence_limit_s if self._term is not None else self.standby_limit_s
        if silent is None or silent < limit:
            return False
        waits = f"each target waits {limit:.1f}s first, for a controller leading ahead of it"
        self._go_alone(f"{reason} (the store silent for {silent:.1f}s; {waits})", limit)
        return True

    def rejoin(self) -> bool:
        """Back to the pair after finishing alone, once the run is over (the caller knows)
        and the store answers: leading again if its term still holds, else a standby that
        campaigns. False while the store is silent: it stays alone."""
        if self._alone is None or self._silent_since is not None:
            return False
        self._alone, self._lag_s = None, 0.0
        self._detail = "rejoined the pair: the run is over and the store answers"
        self._report()
        return True

    @property
    def alone_lag_s(self) -> float:
        """Alone, how long each target waits before a step reads it to ask it: the silence
        it waited out before going alone. A leader through the store (the other, when only
        this one is cut off) asks first; a former leader alone (``silence_limit_s``) asks
        before a former standby alone (``standby_limit_s``); each later one finds the
        request under way or the target off. With the others gone it only delays the
        shutdown. Finishing alone by its own notice, 0: no one else acts."""
        return self._lag_s

    def _go_alone(self, reason: str, lag_s: float = 0.0, *, declared: bool = False) -> None:
        self._alone, self._lag_s, self._declared = reason, lag_s, declared
        self._detail = f"finishing alone: {reason}"
        self._report()

    # -- fenced writes ---------------------------------------------------------------------

    async def record_run(self, record: RunRecord) -> None:
        """Write a run's record for the standby; nothing while finishing alone. Raises
        ``LeadershipLost`` (not leading, or deposed) or ``StoreUnavailable``."""
        await self._write(lambda term: self._store.record_run(term, record))

    async def record_step(
        self,
        run: RunId,
        step: StepId,
        state: StepState,
        detail: str = "",
        *,
        asked: tuple[AskedTarget, ...] = (),
        handed_over: bool = False,
    ) -> None:
        """Write one step's state (with its requests under way); see ``record_run``."""
        mark = self.mark(step, state, detail, asked=asked, handed_over=handed_over)
        await self._write(lambda term: self._store.record_step(term, run, mark))

    async def record_ups_command(self, run: RunId, mark: StepMark) -> None:
        """The mark a UPS's end command leaves (``Pair.claim_ups_command``), written also
        while finishing alone with the term still held (the store's machines are going
        down, the store still answers): fenced like every write, and the controller that
        leads next must not command that UPS a second time."""
        await self._write(lambda term: self._store.record_step(term, run, mark), alone_too=True)

    async def record_steps(self, marks: Sequence[tuple[RunId, StepMark]]) -> None:
        """Write several steps' states in one fenced write (at most ``MAX_MARKS``); see
        ``record_run``."""
        await self._write(lambda term: self._store.record_steps(term, marks))

    def mark(
        self,
        step: StepId,
        state: StepState,
        detail: str = "",
        *,
        asked: tuple[AskedTarget, ...] = (),
        handed_over: bool = False,
    ) -> StepMark:
        """A step's state as this controller writes it now."""
        return StepMark(step, state, self._me.name, self._clock.now(), detail, asked, handed_over)

    async def record_owed(self, owed: OwedCaches) -> None:
        """Write which caches the leaders owe write-back; see ``record_run``."""
        await self._write(lambda term: self._store.record_owed(term, owed))

    async def forget_run(self, run: RunId) -> None:
        """Remove a run the ledger no longer keeps; see ``record_run``."""
        await self._write(lambda term: self._store.forget_run(term, run))

    @property
    def alone(self) -> bool:
        return self._alone is not None

    @property
    def alone_reason(self) -> str | None:
        """Why this controller goes on without the store, while it does."""
        return self._alone

    async def claim_step(self, run: RunId, step: StepId) -> bool:
        """Just before a step acts: record it ``running`` under this term. True: act. False:
        do not (another controller leads, or the fence came before the store answered). A
        store that does not answer is asked again until the fence; a caller that must act
        regardless applies ``act_without_store``."""
        while True:
            if self.role is Role.ALONE:
                return True
            if not self.may_act():
                return False
            try:
                await self.record_step(run, step, StepState.RUNNING)
                return True
            except LeadershipLost:
                return False
            except StoreUnavailable:
                await asyncio.sleep(RETRY_WRITE_S)

    async def _write(
        self, write: Callable[[Term], Awaitable[None]], *, alone_too: bool = False
    ) -> None:
        """Fenced by the term. Nothing while finishing alone, unless ``alone_too`` and the
        term is still held (then the lease is renewed while the store answers)."""
        if self.role is Role.ALONE and not (alone_too and self._term is not None):
            return
        term, fence = self._term, self.fence_at
        if term is None or fence is None or not self.may_act():
            raise LeadershipLost(f"{self._me.name} does not lead ({self.role.value})")
        try:
            await within(max(fence - self._clock.monotonic(), 0.001), write(term))
        except TimeoutError:
            self._silent("no answer before the lease could end")
            raise StoreUnavailable(
                f"{self._me.name}: the store did not answer before the lease could end"
            ) from None
        except LeadershipLost as exc:
            self._lost(str(exc))
            self._report()
            raise
        except StoreUnavailable as exc:
            self._silent(str(exc))
            raise
        except Exception as exc:  # refused: the caller treats it as no answer
            raise self._refused(exc) from exc
        self._answered()
