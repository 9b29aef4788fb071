"""A controller pair's cost in etcd, and how soon the standby takes over a shutdown.

Run: ``python3 bench/ha.py [--writes 300] [--renewals 300] [--kills 20]`` (needs Debian's
etcd-server and NUT, and upsguard-vcsim: scripts/setup --tests). It starts three etcd
members on loopback (the test fixture of tests/peers/etcd.py), wins the lease through
``EtcdStore`` and prints p50, p95 and max of:

1. a fenced write, ``record_step`` (the transaction that records a step as started before
   it acts: compare the leader key's revision, put the step), next to a plain put of the
   same value through etcd3aio on the same endpoint, and their ratio measured in this run;
2. a renewal of the lease (``renew``: one keep-alive), which the leader sends every third
   of the TTL;
3. the takeover (``--takeovers``, default 10, on a lease of ``--ttl`` seconds, default 2 as
   the pair's tests use): two ``Leadership``s campaign, the leader's loop is stopped dead
   at a random point of its renewal cycle (as ``kill -9`` stops it: no resign, the lease
   just runs out), and the time from then to the standby's win is measured; next to it the
   design's bound (TTL and a third more) and the issue's (TTL + 2 s). The pair's
   integration test (tests/integration/test_ha_pair.py) shows the standby resumes the run
   once it wins; this is how long the winning takes;
4. the takeover of a real pair during a shutdown (``--kills``, default 20, as issue 25 asks;
   0 skips it), which is what the issue measures and what 3 only bounds from below: the
   integration tests' pair lab (tests/peers/pair.py: two ``upsguard run`` processes on the
   lab's 2 s lease, upsd, upsguard-vcsim, these etcd members), fresh for each kill (a new
   upsd and vcsim and a site of its own in etcd, so no kill inherits a guest still
   shutting down or a key of the one before). Both controllers up, the mains fail, and
   once the leader's first guest shutdown reaches vcsim the leader is killed with SIGKILL.
   Measured: the time from the kill to the standby's status saying it leads and resumed
   that run (``ha.role == "leader"``, ``service.resumed == <run id>``), polled every
   50 ms; each figure is taken when the first poll to see it answers, so it is late by at
   most 50 ms and one status answer (whose p50 is printed). Next to it the issue's bound,
   lease + 2 s, and how many kills met it. Then each resumed run must end done with every
   VM and host asked once, in the plan's order, at vcsim (the test's own check); the
   kills where it did not, or where the lab or the takeover failed, are counted.
   A kill costs about 13 s on two cores (the lab, the shutdown to its end): the default's
   20 take between 4 and 5 minutes, the whole bench about 5.

The figures are loopback's, with members that share this machine's disk: on a network add
its round trips, and etcd's fsync on the members' own disks. In 4 the two controllers,
vcsim, upsd and etcd also share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest
from etcd3aio import Etcd3Client
from tests.peers import nut
from tests.peers.etcd import EtcdCluster, EtcdSite, start_cluster
from tests.peers.pair import MACHINES, TTL_S, PairLab, start_lab, start_nut
from tests.peers.service import ServiceProcess
from tests.peers.vcsim import Tls, make_tls, start_vcsim
from tests.peers.webhook import WebhookServer, serve_webhook

from upsguard.clock import SystemClock
from upsguard.config.ha import HaConfig, endpoint_address
from upsguard.engine.leadership import Leadership, LeadershipState, Role
from upsguard.errors import UpsguardError
from upsguard.models import RunId, StepId, StepState
from upsguard.plugins.coordination.base import Candidate, StepMark, Term
from upsguard.plugins.coordination.etcd import EtcdStore

SITE = "bench"
POLL_S = 0.05
"""How often the kills' standby is asked for its status: the figure's resolution."""


def figures(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95, ordered[-1]


def line(what: str, samples: list[float]) -> str:
    p50, p95, top = figures(samples)
    return (
        f"  {what:<34} p50 {p50 * 1000:7.2f} ms  p95 {p95 * 1000:7.2f} ms  max {top * 1000:7.2f} ms"
    )


async def timed(count: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for i in range(count):
        start = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - start)
    return samples


async def measure(cluster: EtcdCluster, writes: int, renewals: int) -> None:
    settings = HaConfig.model_validate(
        {"name": "bench", "endpoints": cluster.endpoints, "lease_ttl": "10s"}
    )
    store = EtcdStore(SITE, settings)
    host, port = endpoint_address(cluster.endpoints[0])
    plain = Etcd3Client([f"{host}:{port}"])
    await plain.connect()
    assert plain.kv is not None
    kv = plain.kv
    try:
        term = await store.campaign(Candidate("bench"), 10)
        assert isinstance(term, Term), term
        at = datetime.now(UTC)
        run = RunId("shutdown-bench")

        def mark(i: int) -> StepMark:
            return StepMark(StepId(f"stop:vm{i:05d}"), StepState.RUNNING, "bench", at)

        await timed(20, lambda i: store.record_step(term, run, mark(i)))  # warm up both
        await timed(20, lambda i: kv.put(f"/bench-plain/{i}".encode(), b"x", timeout=5))
        fenced = await timed(writes, lambda i: store.record_step(term, run, mark(i)))
        puts = await timed(
            writes, lambda i: kv.put(f"/bench-plain/{i:05d}".encode(), b"x" * 120, timeout=5)
        )
        renew = await timed(renewals, lambda i: store.renew(term))
        members = len(cluster.endpoints)
        print(f"etcd, {members} members on loopback: {writes} writes, {renewals} renewals")
        print(line("fenced write (record_step)", fenced))
        print(line("plain put (etcd3aio, no fence)", puts))
        print(line("lease renewal (renew)", renew))
        ratio = statistics.median(fenced) / statistics.median(puts)
        print(f"  fenced write / plain put, p50: {ratio:.2f}")
        await store.resign(term)
    finally:
        await plain.close()
        await store.close()


async def until(check: Callable[[], bool], within: float) -> None:
    async with asyncio.timeout(within):
        while not check():
            await asyncio.sleep(0.005)


async def one_takeover(cluster: EtcdCluster, ttl: float, trial: int) -> float:
    """Seconds from the leader's death to the standby's win."""
    site = f"{SITE}-takeover-{trial}"
    stores = []
    for name in ("a", "b"):
        settings = HaConfig.model_validate(
            {"name": name, "endpoints": cluster.endpoints, "lease_ttl": f"{ttl:g}s"}
        )
        stores.append(EtcdStore(site, settings))
    won: list[float] = []

    def on_b(state: LeadershipState) -> None:
        if state.role is Role.LEADER and not won:
            won.append(time.monotonic())

    clock = SystemClock()
    a = Leadership(stores[0], Candidate("a"), ttl_s=ttl, fence_margin_s=0.5, clock=clock)
    b = Leadership(
        stores[1], Candidate("b"), ttl_s=ttl, fence_margin_s=0.5, clock=clock, on_change=on_b
    )
    a_task = asyncio.create_task(a.run())
    b_task: asyncio.Task[None] | None = None
    try:
        await until(lambda: a.role is Role.LEADER, 10)
        b_task = asyncio.create_task(b.run())
        await until(lambda: b.state().leader == "a", 10)
        await asyncio.sleep(random.uniform(0, a.renew_every_s))
        a_task.cancel()  # dead: no resign, no more renewals
        killed = time.monotonic()
        await until(lambda: bool(won), 3 * ttl)
        return won[0] - killed
    finally:
        for task in (a_task, b_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if b.term is not None:
            await b.hand_over()
        for store in stores:
            await store.close()


async def takeovers(cluster: EtcdCluster, count: int, ttl: float) -> None:
    logging.getLogger("upsguard").setLevel(logging.ERROR)  # each change of role is logged
    samples = [await one_takeover(cluster, ttl, i) for i in range(count)]
    print(f"takeover after the leader dies (lease {ttl:g}s, {count} times)")
    print(line("leader dead -> standby leads", samples))
    print(
        f"  bound: lease + a third = {ttl * 4 / 3:.2f} s; the issue's: lease + 2 s = {ttl + 2:g} s"
    )


@dataclass(frozen=True)
class Kill:
    """One leader killed mid-shutdown, as the standby and vcsim saw it."""

    takeover_s: float | None
    """From the kill to the standby's status saying it leads and resumed the run; None if it
    never said so (then ``failure`` says why)."""
    answers_s: tuple[float, ...]
    """How long each status poll took to answer: part of the figure's resolution."""
    failure: str | None = None
    """Why this kill's run did not end right (or the lab did not get that far), if so."""


def first_line(exc: BaseException) -> str:
    """What a failed wait or check says, without the logs it carries."""
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def resumed_after(
    standby: ServiceProcess, run: str, killed: float, within: float
) -> tuple[float | None, list[float]]:
    """Poll ``standby`` every ``POLL_S`` until it leads and says it resumed ``run``; the
    seconds from ``killed`` to the answer that said so (None after ``within``), and how long
    each answer took."""
    answers: list[float] = []
    while time.monotonic() < killed + within:
        asked = time.monotonic()
        try:
            status = standby.status()
        except UpsguardError:  # busy or not answering this once: ask again
            status = None
        answered = time.monotonic()
        answers.append(answered - asked)
        ha = (status or {}).get("ha") or {}
        if status and ha.get("role") == "leader" and status["service"]["resumed"] == run:
            return answered - killed, answers
        time.sleep(max(0.0, POLL_S - (answered - asked)))
    return None, answers


def kill_the_leader(lab: PairLab) -> Kill:
    """Both controllers up, the mains cut; once the leader's first guest shutdown reaches
    vcsim, kill -9 the leader and time the standby's takeover; then check the run ends
    right (tests/integration/test_ha_pair.py, the kill -9 test, without its asserts)."""
    lab.start()
    leader = lab.leader()
    standby = lab.other(leader)
    lab.outage(held=True)
    lab.wait(lambda: bool(lab.asked("VmGuestShutdownEvent")), "the leader's first guest shutdown")
    run = str(lab.status(leader)["run"]["id"])
    killed = time.monotonic()
    lab.controllers[leader].kill9()
    took, answers = resumed_after(lab.controllers[standby], run, killed, TTL_S + 30)
    if took is None:
        return Kill(None, tuple(answers), f"the standby did not resume {run} within {TTL_S + 30} s")
    lab.release_guests()
    failure = None
    try:
        lab.wait(lambda: lab.shutdown_done(standby), "the resumed shutdown to end done", 120)
        lab.assert_each_stopped_once_in_order(last=MACHINES[standby])
    except pytest.fail.Exception as exc:
        failure = f"the run: {first_line(exc)}"
    except AssertionError as exc:  # outside pytest a plain assert says nothing: say what vcsim saw
        failure = (
            f"the run: {first_line(exc)}; guest shutdowns at vcsim "
            f"{lab.asked('VmGuestShutdownEvent')}, host shutdowns {lab.asked('HostShutdownEvent')}"
        )
    return Kill(took, tuple(answers), failure)


def one_kill(cluster: EtcdCluster, root: Path, tls: Tls, webhook: WebhookServer, n: int) -> Kill:
    """``kill_the_leader`` on a lab of its own: a new upsd and vcsim, a new site in etcd."""
    lab_dir = root / f"kill-{n}"
    with contextlib.ExitStack() as stack:
        try:
            ups = start_nut(partial(nut.start_nut, lab_dir / "nut"))
            stack.callback(ups.stop)
            vc = start_lab(partial(start_vcsim, tls))
            stack.callback(vc.stop)
            lab = PairLab(EtcdSite(cluster, f"bench-kill-{n}"), ups, vc, webhook, lab_dir)
            lab.configure()
            stack.callback(lab.stop)
            return kill_the_leader(lab)
        except (AssertionError, pytest.fail.Exception) as exc:
            return Kill(None, (), f"the lab: {first_line(exc)}")


def kills(cluster: EtcdCluster, count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ha-kills-") as tmp, serve_webhook() as hook:
        root = Path(tmp)
        tls = make_tls(root / "tls")
        started = time.monotonic()
        done = [one_kill(cluster, root, tls, hook, n) for n in range(count)]
        spent = time.monotonic() - started
    samples = [k.takeover_s for k in done if k.takeover_s is not None]
    answers = [a for k in done for a in k.answers_s]
    bound = TTL_S + 2
    print(
        f"takeover of a real pair, the leader killed mid-shutdown (two `upsguard run`, "
        f"lease {TTL_S}s, {count} kills, {spent:.0f} s in all)"
    )
    if samples:
        print(line("leader killed -> standby resumed", samples))
    met = sum(1 for s in samples if s <= bound)
    print(
        f"  bound (the issue's): lease + 2 s = {bound:g} s; met by {met} of {count} kills"
        + (" (every one)" if met == count else "")
    )
    if answers:
        print(
            f"  resolution: status polled every {POLL_S * 1000:.0f} ms (an answer: p50 "
            f"{statistics.median(answers) * 1000:.1f} ms); a figure is late by at most a poll "
            "and an answer"
        )
    failed = [(n, k.failure) for n, k in enumerate(done) if k.failure is not None]
    print(
        f"  runs that did not end right (done, each VM and host asked once, in order): "
        f"{len(failed)} of {count}"
    )
    for n, why in failed:
        print(f"    kill {n + 1}: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--renewals", type=int, default=300)
    parser.add_argument("--takeovers", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=2.0, help="the takeovers' lease")
    parser.add_argument(
        "--kills",
        type=int,
        default=20,
        help="leaders of a real pair killed mid-shutdown (issue 25 asks for 20; 0: none)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ha-") as root:
        cluster = start_cluster(Path(root))
        try:
            asyncio.run(measure(cluster, args.writes, args.renewals))
            if args.takeovers:
                asyncio.run(takeovers(cluster, args.takeovers, args.ttl))
            if args.kills:
                kills(cluster, args.kills)
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
