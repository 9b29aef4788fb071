"""``kill -9`` at random moments of a shutdown and a startup, 30 trials: the restarted
service finishes each run without doing a step twice, without breaking the order, and
leaves no run running.

The moment of each kill is chosen by events, not by the clock: after the k-th call the
devices logged (k random), so every trial is reproducible from its seed.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import LOW_BATTERY, ONLINE, ORDER, Lab
from tests.peers.service import ServiceProcess

pytestmark = [pytest.mark.nut, pytest.mark.slow, pytest.mark.timeout(1800)]

TRIALS = int(os.environ.get("UPSGUARD_KILL9_TRIALS", "30"))
DEVICES = ["web", "db", "h1", "nas1"]


def quick_site(lab: Lab) -> dict[str, Any]:
    site = lab.site()
    site["platforms"]["cmd"]["poll_interval"] = "100ms"
    site["policies"].update(
        poll_interval="200ms",
        power_returns={"online_for": "1s"},
        startup={"online_for": "1s", "charge_above": 0},
    )
    return site


def calls_reach(lab: Lab, count: int, prefix: str) -> bool:
    return sum(1 for c in lab.calls() if c.startswith(prefix)) >= count


def kill_after(svc: ServiceProcess, lab: Lab, count: int, prefix: str) -> None:
    """kill -9 once ``count`` calls starting with ``prefix`` were logged."""
    svc.wait(lambda: calls_reach(lab, count, prefix), f"{count} '{prefix}' calls", 60)
    svc.kill9()


def trial(lab: Lab, tmp: Path, rng: random.Random) -> list[str]:
    """One outage and one return of power, each cut by a kill -9; the problems found."""
    from tests.peers.service import write_site

    svc = write_site(tmp, quick_site(lab))
    lab.nut.write("ups1", ONLINE)
    try:
        svc.start()
        lab.outage(LOW_BATTERY)
        kill_after(svc, lab, rng.randint(1, 2 * len(DEVICES) - 1), "stop")
        svc.start()
        lab.wait_all_off(svc)
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down")
        lab.nut.write("ups1", ONLINE)
        kill_after(svc, lab, rng.randint(1, len(DEVICES)), "start")
        svc.start()
        svc.wait(lambda: svc.status()["phase"] == "normal", "the site to be back", 90)
    finally:
        svc.stop()
    return problems(lab, svc)


def problems(lab: Lab, svc: ServiceProcess) -> list[str]:
    calls = lab.calls()
    found = [f"{d} stopped {calls.count(f'stopped {d}')} times" for d in DEVICES]
    found = [p for p, d in zip(found, DEVICES, strict=True) if calls.count(f"stopped {d}") != 1]
    found += [f"{d} started twice" for d in DEVICES if calls.count(f"start {d}") > 1]
    found += [f"{d} not started" for d in DEVICES if calls.count(f"start {d}") == 0]
    found += lab.order_violations()
    starts = [c.split()[1] for c in calls if c.startswith("start ")]
    for first, then in ORDER:  # the startup is the mirror: nas1, h1, db, web
        if then in starts and first in starts and starts.index(first) < starts.index(then):
            found.append(f"{first} started before {then}")
    journal = svc.read_journal()
    try:
        running = [r.id for r in journal.read.runs(limit=50, with_steps=False) if r.unfinished]
    finally:
        journal.close()
    found += [f"run {r} left unfinished" for r in running]
    return found


def test_kill_9_at_random_moments_never_repeats_a_step_or_breaks_the_order(
    tmp_path: Path, nut_factory: Any
) -> None:
    nut = nut_factory({"ups1": ONLINE, "ups2": ONLINE}, ext="dev")
    rng = random.Random(20261123)
    failures: dict[int, list[str]] = {}
    for index in range(TRIALS):
        lab = Lab(tmp_path / f"lab{index}", nut)
        found = trial(lab, tmp_path / f"trial{index}", rng)
        if found:
            failures[index] = found
    assert failures == {}
