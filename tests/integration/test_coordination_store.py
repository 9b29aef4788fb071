"""The CoordinationStore contract, against a real three-member etcd on loopback (and the
shipped in-memory store, whose behaviour is held to the same tests).

Leadership is exclusive; a lease nobody renews ends and its key with it; a deposed
leader's fenced write is refused, says who leads, and changes nothing; the ledger comes
back as it was written; one member stopped or paused changes nothing; two members stopped
make every call fail with ``StoreUnavailable`` within a bound, and the store works again
once they are back. Time is never raced: a test waits for the change it expects (the
leader key gone, seen through ``wait_for_change``) within a bound that only a hang reaches.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest

from tests.peers.etcd import EtcdSite
from upsguard.clock import SystemClock
from upsguard.config.ha import HaConfig
from upsguard.errors import LeadershipLost, StoreUnavailable
from upsguard.models import ResourceId, RunId, StepId, StepState
from upsguard.plugins.coordination.base import (
    MAX_MARKS,
    AloneNotice,
    Candidate,
    ControllerView,
    CoordinationStore,
    Leader,
    OwedCaches,
    StepMark,
    Term,
    UpsSeen,
)
from upsguard.plugins.coordination.etcd import EtcdStore
from upsguard.plugins.coordination.memory import MemorySite, MemoryStore
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunRecord, RunSpec

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
TTL = 2.0
"""The lease of the test that lets one end; the others hold theirs through any wait."""
LONG = 30.0
REQUEST_TIMEOUT = 1.0
#: Every call returns or raises within a few request timeouts; a hang runs into this.
BOUND = 3 * 1.5 * REQUEST_TIMEOUT + 2
A, B = Candidate("ctl-a", ResourceId("mgmt-a")), Candidate("ctl-b", ResourceId("mgmt-b"))
AT = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)


def settings(etcd: EtcdSite, name: str = "ctl-a") -> HaConfig:
    return HaConfig.model_validate(
        {
            "name": name,
            "endpoints": etcd.endpoints,
            "lease_ttl": f"{TTL:g}s",
            "fence_margin": "0.5s",
            "request_timeout": f"{REQUEST_TIMEOUT:g}s",
        }
    )


@dataclass(frozen=True)
class Backend:
    """Opens ``count`` stores of one site, as the controllers of a pair each hold one."""

    name: str
    open: Callable[[int], list[CoordinationStore]]


@pytest.fixture(params=[pytest.param("etcd", marks=pytest.mark.etcd), "memory"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "etcd":
        etcd: EtcdSite = request.getfixturevalue("etcd")
        return Backend(
            "etcd",
            lambda count: [EtcdStore(etcd.site, settings(etcd, f"c{i}")) for i in range(count)],
        )
    shared = MemorySite(SystemClock())
    return Backend("memory", lambda count: [MemoryStore("t", shared) for _ in range(count)])


@asynccontextmanager
async def stores(
    backend: Backend | EtcdSite, count: int = 2
) -> AsyncIterator[list[CoordinationStore]]:
    if isinstance(backend, EtcdSite):
        etcd = backend
        backend = Backend(
            "etcd", lambda n: [EtcdStore(etcd.site, settings(etcd, f"c{i}")) for i in range(n)]
        )
    opened = backend.open(count)
    try:
        yield opened
    finally:
        for store in opened:
            await store.close()


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(90):
            return await scenario()

    return asyncio.run(bounded())


def record(run_id: str, outcome: RunOutcome | None = None) -> RunRecord:
    spec = RunSpec(RunId(run_id), RunKind.SHUTDOWN, RunOrigin.POLICY, "runtime < plan + 5m", AT)
    return RunRecord(spec, outcome=outcome)


def mark(step: str, state: StepState, by: str = "ctl-a") -> StepMark:
    return StepMark(StepId(step), state, by, AT, "")


async def won(store: CoordinationStore, who: Candidate = A, ttl: float = LONG) -> Term:
    term = await store.campaign(who, ttl)
    assert isinstance(term, Term), term
    return term


async def until_nobody_leads(store: CoordinationStore, within: float) -> None:
    """Wait for the leader key to go (a lease nobody renews), seen as a change, not slept."""
    async with asyncio.timeout(within):
        while True:
            seen = await store.snapshot()
            if seen.leader is None:
                return
            await store.wait_for_change(seen.revision, within)


def test_each_store_keeps_the_protocol(backend: Backend) -> None:
    (store,) = backend.open(1)
    assert isinstance(store, CoordinationStore)
    for name, _ in inspect.getmembers(CoordinationStore, inspect.isfunction):
        if not name.startswith("_"):
            assert inspect.iscoroutinefunction(getattr(store, name)), name


def test_one_leader_at_a_time_and_everyone_sees_who(backend: Backend) -> None:
    async def scenario() -> None:
        async with stores(backend, 4) as opened:
            people = [Candidate(f"ctl-{i}") for i in range(4)]
            results = await asyncio.gather(
                *(s.campaign(p, LONG) for s, p in zip(opened, people, strict=True))
            )
            terms = [r for r in results if isinstance(r, Term)]
            assert len(terms) == 1
            (term,) = terms
            assert all(r == term.leader for r in results if isinstance(r, Leader))
            for store in opened:
                assert await store.leader() == term.leader
            assert term.ttl_s == LONG
            assert await opened[0].renew(term) > 0

    run(scenario)


def test_a_lease_nobody_renews_ends_and_the_standby_takes_over(backend: Backend) -> None:
    """The leader stops renewing (as a paused or dead process does): its key goes with the
    lease, the standby wins a newer term, and the old leader learns that it lost."""

    async def scenario() -> None:
        async with stores(backend) as (first, second):
            old = await won(first, A, TTL)
            assert await second.campaign(B, TTL) == old.leader
            await until_nobody_leads(second, within=TTL * 4 + BOUND)
            new = await won(second, B)
            assert new.token > old.token
            with pytest.raises(LeadershipLost):
                await first.renew(old)
            with pytest.raises(LeadershipLost) as refused:
                await first.record_step(old, RunId("r1"), mark("stop:vm1", StepState.RUNNING))
            assert refused.value.leader == "ctl-b"
            assert "ctl-b leads now" in str(refused.value)
            assert (await second.snapshot()).steps_of(RunId("r1")) == {}

    run(scenario)


def test_a_deposed_leader_cannot_write_any_part_of_the_ledger(backend: Backend) -> None:
    async def scenario() -> None:
        async with stores(backend) as (first, second):
            old = await won(first, A)
            await first.record_run(old, record("r1"))
            await first.record_owed(old, OwedCaches(("nas-ssd",)))
            assert (await second.snapshot()).owed == ("nas-ssd",)
            await first.resign(old)
            new = await won(second, B)
            writes: list[Callable[[], Awaitable[None]]] = [
                lambda: first.record_run(old, record("r1", RunOutcome.DONE)),
                lambda: first.record_step(old, RunId("r1"), mark("s1", StepState.DONE)),
                lambda: first.record_steps(old, [(RunId("r1"), mark("s2", StepState.DONE))]),
                lambda: first.forget_run(old, RunId("r1")),
                lambda: first.declare_alone(old, AloneNotice("ctl-a", old.token, AT, "why")),
                lambda: first.record_owed(old, OwedCaches()),
            ]
            for write in writes:
                with pytest.raises(LeadershipLost):
                    await write()
            seen = await second.snapshot()
            assert seen.leader == new.leader
            assert seen.runs == (record("r1"),)
            assert seen.steps == {}
            assert seen.alone is None
            assert seen.owed == ("nas-ssd",)

    run(scenario)


def test_many_step_marks_are_written_together_and_read_back(backend: Backend) -> None:
    """A thousand steps' claims at the start of a shutdown go in writes of ``MAX_MARKS``
    (the most one etcd transaction takes by default), each all or nothing."""

    async def scenario() -> None:
        async with stores(backend) as (leader, standby):
            term = await won(leader, A)
            marks = [
                (RunId(f"r{i % 2}"), mark(f"stop:vm{i}", StepState.RUNNING))
                for i in range(MAX_MARKS)
            ]
            before = await standby.snapshot()
            await leader.record_steps(term, marks)
            seen = await standby.snapshot()
            assert seen.revision == before.revision + 1  # one write, all of it
            for run_id in (RunId("r0"), RunId("r1")):
                written = {m.step: m for r, m in marks if r == run_id}
                assert dict(seen.steps_of(run_id)) == written

    run(scenario)


def test_a_resigned_term_lets_the_standby_win_at_once(backend: Backend) -> None:
    async def scenario() -> None:
        async with stores(backend) as (first, second):
            term = await won(first, A)
            await first.resign(term)
            assert await first.leader() is None
            await won(second, B)  # no wait for the lease: it was revoked
            await first.resign(term)  # a term already over resigns quietly

    run(scenario)


def test_a_controller_that_restarted_waits_for_its_own_old_lease(backend: Backend) -> None:
    async def scenario() -> None:
        async with stores(backend) as (before, after):
            term = await won(before, A)
            assert await after.campaign(A, TTL) == term.leader  # same name, another process

    run(scenario)


def test_the_ledger_reads_back_as_written_at_one_revision(backend: Backend) -> None:
    async def scenario() -> None:
        async with stores(backend) as (leader, standby):
            term = await won(leader, A)
            await leader.record_run(term, record("r1"))
            await leader.record_run(term, record("r2/odd id"))
            await leader.record_run(term, record("r1", RunOutcome.ABANDONED))  # keeps its place
            steps = [mark("stop:vm/1", StepState.RUNNING), mark("stop:vm2", StepState.DONE)]
            for step in steps:
                await leader.record_step(term, RunId("r2/odd id"), step)
            done = mark("stop:vm/1", StepState.DONE)
            await leader.record_step(term, RunId("r2/odd id"), done)
            notice = AloneNotice("ctl-a", term.token, AT, "etcd's machines stop next")
            await leader.declare_alone(term, notice)
            seen = await standby.snapshot()
            assert seen.leader == term.leader
            assert seen.runs == (record("r1", RunOutcome.ABANDONED), record("r2/odd id"))
            assert seen.active == record("r2/odd id")
            assert dict(seen.steps_of(RunId("r2/odd id"))) == {
                StepId("stop:vm/1"): done,
                StepId("stop:vm2"): steps[1],
            }
            assert seen.alone == notice
            assert seen.unreadable == ()
            await leader.forget_run(term, RunId("r2/odd id"))
            after = await standby.snapshot()
            assert after.runs == (record("r1", RunOutcome.ABANDONED),)
            assert after.steps == {}
            assert after.revision > seen.revision

    run(scenario)


@pytest.mark.etcd
def test_a_value_written_by_hand_is_named_and_the_rest_still_reads(etcd: EtcdSite) -> None:
    async def scenario() -> None:
        async with stores(etcd, 1) as (store,):
            term = await won(store, A)
            await store.record_run(term, record("r1"))
            put = etcd.cluster.etcdctl("put", f"{etcd.prefix}runs/r0", "{not json")
            out, _ = put.communicate(timeout=15)  # reads to the end and closes the pipe
            assert put.returncode == 0, out
            seen = await store.snapshot()
            assert seen.runs == (record("r1"),)
            [bad] = seen.unreadable
            assert bad.key == f"{etcd.prefix}runs/r0"
            assert bad.why.startswith("not a RunRecord")

    run(scenario)


def test_a_change_is_never_missed_between_a_read_and_the_wait(backend: Backend) -> None:
    async def scenario() -> None:
        async with stores(backend) as (leader, standby):
            term = await won(leader, A)
            seen = await standby.snapshot()
            await leader.record_run(term, record("r1"))  # before the standby waits
            assert await standby.wait_for_change(seen.revision, BOUND) is True
            now = await standby.snapshot()
            assert now.runs == (record("r1"),)
            assert await standby.wait_for_change(now.revision, 0.3) is False  # nothing since

    run(scenario)


@pytest.mark.etcd
def test_a_watch_whose_client_another_call_closed_ends_as_the_store_not_answering(
    etcd: EtcdSite, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd's client reconnects a watch that lost its member, on the same client. A call
    that failed on that member meanwhile closed the client, so the watch's next attempt
    meets a closed channel: the wait ends as the store not answering, like any call to a
    member gone, never as the client's own error (the standby's loop that follows the
    ledger logged it as a bug of ours, with its traceback, in the middle of an outage)."""

    async def scenario() -> None:
        async with stores(etcd, 1) as (store,):
            seen = await store.snapshot()
            watching = asyncio.ensure_future(store.wait_for_change(seen.revision, LONG))
            etcd.cluster.stop(0)  # the member both the watch and the next call use first
            async with asyncio.timeout(BOUND):  # etcd's client says it reconnects the watch
                while not any("transient error" in r.getMessage() for r in caplog.records):
                    await asyncio.sleep(0.05)
            await store.snapshot()  # fails on the stopped member (closing its client), not on m2
            with pytest.raises(StoreUnavailable, match="watching the ledger"):
                async with asyncio.timeout(BOUND):
                    await watching

    run(scenario)


@pytest.mark.etcd
def test_a_call_whose_client_another_call_closed_goes_on_to_the_next_member(
    etcd: EtcdSite,
) -> None:
    """Two calls in flight on a member that stopped answering: the first gives up and closes
    the member's client, and gRPC cancels the other's call with it. That call ended with a
    ``CancelledError`` nothing had asked for, which ended the task that made it: the pair's
    leadership loop died that way, unheard. It is the member not answering: the call goes
    on to the next member, as the first did. On a busy machine the other members may be
    too slow for a call as well (a full lane beside busy loops: the first call's): that call
    ends ``StoreUnavailable`` naming each member it went on to, never cancelled."""

    async def scenario() -> None:
        async with stores(etcd, 1) as (store,):
            await store.snapshot()  # the client of the first member is made
            etcd.cluster.pause(0)
            first = asyncio.ensure_future(store.snapshot())
            await asyncio.sleep(REQUEST_TIMEOUT / 2)  # in flight when the first gives up
            second = asyncio.ensure_future(store.snapshot())
            answers = await asyncio.gather(first, second, return_exceptions=True)
            for answer in answers:
                if isinstance(answer, StoreUnavailable):
                    assert all(url in str(answer) for url in etcd.cluster.endpoints), answer
                else:
                    assert type(answer).__name__ == "SharedLedger", repr(answer)

    try:
        run(scenario)
    finally:
        etcd.cluster.resume(0)


def view(by: str, word: str = "online") -> ControllerView:
    return ControllerView(by, "standby", AT, (UpsSeen("ups1", word, 97.0, 1800.0),))


def test_each_controller_sees_the_others_view_until_its_own_lease_ends(backend: Backend) -> None:
    """Both publish, leader or not; a controller that stops publishing (dead, paused, cut
    off) leaves no view behind once its own lease ends, whoever leads; the ledger does not
    carry the views."""

    async def scenario() -> None:
        async with stores(backend) as (first, second):
            term = await won(first, A)
            assert await second.exchange_views(view("ctl-b", "lost"), TTL) == []
            assert await first.exchange_views(view("ctl-a"), LONG) == [view("ctl-b", "lost")]
            assert await second.exchange_views(view("ctl-b"), TTL) == [view("ctl-a")]
            assert await first.exchange_views(view("ctl-a"), LONG) == [view("ctl-b")]
            async with asyncio.timeout(TTL * 4 + BOUND):  # ctl-b no longer publishes
                while await first.exchange_views(view("ctl-a"), LONG):
                    await first.wait_for_change((await first.snapshot()).revision, TTL)
            ledger = await second.snapshot()
            assert (ledger.leader, ledger.unreadable) == (term.leader, ())

    run(scenario)


@pytest.mark.etcd
def test_one_member_stopped_or_paused_changes_nothing(etcd: EtcdSite) -> None:
    async def scenario() -> None:
        async with stores(etcd) as (leader, standby):
            term = await won(leader, A)
            await leader.record_run(term, record("r1"))
            etcd.cluster.stop(0)  # the endpoint both stores use first
            etcd.cluster.wait_ready([1, 2])  # the two elect a leader if it was m1: etcd's part
            await leader.renew(term)
            await leader.record_step(term, RunId("r1"), mark("s1", StepState.RUNNING))
            assert (await standby.snapshot()).steps_of(RunId("r1"))
            assert await standby.campaign(B, TTL) == term.leader
            etcd.cluster.start(0)
            etcd.cluster.wait_ready([0])
            etcd.cluster.pause(1)  # a partitioned member: it holds the connection, says nothing
            etcd.cluster.wait_ready([0, 2])
            await leader.renew(term)
            await leader.record_step(term, RunId("r1"), mark("s1", StepState.DONE))
            after = await standby.snapshot()
            assert after.steps_of(RunId("r1"))[StepId("s1")].state is StepState.DONE
            health = await standby.probe()
            assert [h.answered for h in health] == [True, False, True]

    run(scenario)


@pytest.mark.etcd
def test_two_members_stopped_fail_every_call_within_a_bound_then_it_recovers(
    etcd: EtcdSite,
) -> None:
    """Without a quorum nothing can be written or read, and each call says so within a
    few request timeouts. A renewal is the exception for a moment: etcd's leader answers
    it alone until it notices, within its election timeout, that it lost the quorum (the
    majority's new leader then extends every lease, so no term ends early)."""

    async def scenario() -> None:
        async with stores(etcd) as (leader, standby):
            term = await won(leader, A)
            etcd.cluster.stop(0)
            etcd.cluster.stop(2)
            calls: list[Callable[[], Awaitable[Any]]] = [
                lambda: leader.record_step(term, RunId("r1"), mark("s1", StepState.RUNNING)),
                lambda: standby.snapshot(),
                lambda: standby.campaign(B, TTL),
                lambda: standby.leader(),
            ]
            for call in calls:
                with pytest.raises(StoreUnavailable) as lost:
                    async with asyncio.timeout(BOUND):
                        await call()
                assert "no endpoint answered" in str(lost.value)
            with pytest.raises(StoreUnavailable):
                async with asyncio.timeout(BOUND * 2):
                    while True:
                        await leader.renew(term)
                        await asyncio.sleep(0.1)
            assert [h.answered for h in await standby.probe()] == [False, True, False]
            etcd.cluster.heal()
            async with asyncio.timeout(BOUND):
                seen = await standby.snapshot()
                again = await standby.campaign(B, TTL)
            assert seen.leader in (None, term.leader)
            assert again == term.leader or isinstance(again, Term)

    run(scenario)
