"""The dry run against the real one: ``upsguard run`` with NUT (``dummy-ups`` + ``upsd``)
playing the outage and upsguard-vcsim's guests taking set times to shut down, beside
``upsguard simulate`` of the same site file and the same outage.

- The simulator's predicted timeline agrees with the real run's: the finish within 10 %,
  counted from the moment each went on battery, and the steps in the same order.
- After one real run, the durations learned from its journal bring the plan's estimate
  within 10 % of the next real run's duration (and closer than the site file's defaults).

Timing is compared as ratios measured in each run, never as absolute wall-clock times.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_end_to_end import ONLINE, on_battery
from tests.peers.nut import NutServer
from tests.peers.service import ServiceProcess, write_site
from tests.peers.vcsim import LAB_ARGS, Vcsim, VmSpec, create_vm, wait_for_tools
from upsguard.clock import run_virtual
from upsguard.config.loading import load_site
from upsguard.config.scenario import parse_scenario
from upsguard.events import Event, PhaseChanged, RunFinished, StepFinished, StepStarted
from upsguard.journal import Journal
from upsguard.journal.learned import learned_durations
from upsguard.journal.rows import RunRow, parse_iso
from upsguard.models import Direction, Phase
from upsguard.runbooks.plan import Durations
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunKind
from upsguard.simulation.simulator import Simulation, SimulationReport

pytestmark = [pytest.mark.nut, pytest.mark.vcsim, pytest.mark.timeout(300)]

GUESTS_MS = {"dc01": 3000, "sql01": 5000, "web-01": 4000, "web-02": 4000}
HOSTS = {"esx0": "DC0_C0_H0", "esx1": "DC0_C0_H1"}
PLACED = {"dc01": "DC0_C0_H0", "sql01": "DC0_C0_H1", "web-01": "DC0_C0_H0", "web-02": "DC0_C0_H1"}
ALLOWED = 0.10


@pytest.fixture
def nut(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    return server


def timed_lab(vcsim_factory: Any) -> Vcsim:
    """A fresh vCenter whose guests take ``GUESTS_MS`` to shut down."""
    sim: Vcsim = vcsim_factory(*LAB_ARGS)
    for name, ms in GUESTS_MS.items():
        create_vm(sim, VmSpec(name, PLACED[name], guest_shutdown=str(ms)))
    wait_for_tools(sim)
    return sim


def truth_site(
    tmp: Path, nut: NutServer, lab: Vcsim, *, estimates: bool, journal: Path | None = None
) -> ServiceProcess:
    """One site for the real run and the dry run: NUT's UPS (with the battery model's
    reference point, which only the simulator reads), vCenter's VMs and hosts. With
    ``estimates`` each resource's ``estimate`` says what the guests really take."""

    tmp.mkdir(parents=True, exist_ok=True)

    def estimate(seconds: float) -> dict[str, Any]:
        return {"estimate": {"stop": f"{seconds:g}s"}} if estimates else {}

    vm = {"kind": "vm", "platform": "vc", "guest_timeout": "60s"}
    resources: list[dict[str, Any]] = [
        {"id": "dc01", **vm, "runs_on": ["esx0"], **estimate(3)},
        {"id": "sql01", **vm, "runs_on": ["esx1"], "depends_on": ["dc01"], **estimate(5)},
        {
            "id": "web",
            **vm,
            "kind": "vm_group",
            "select": {"name": "web-*"},
            "count": 2,
            "runs_on": ["esx0", "esx1"],
            "depends_on": ["sql01"],
            **estimate(4),
        },
    ]
    resources += [
        {"id": rid, "kind": "host", "platform": "vc", "host": host, **estimate(0.5)}
        for rid, host in HOSTS.items()
    ]
    site: dict[str, Any] = {
        "site": "truth",
        "ups": [
            {
                "name": "ups1",
                "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"},
                "runtime_at": {"minutes": 5, "load_watts": 100},
                "other_load_watts": 100,
            }
        ],
        "platforms": {"vc": lab.settings_dict(tmp)},
        "resources": resources,
        "policies": {
            "poll_interval": "500ms",
            "on_battery": {"after": "1s"},
            "shutdown": {"when_any": ["low_battery", "runtime < plan + 10m"]},
            "required_margin": "2m",
        },
    }
    if journal is not None:
        site["journal"] = str(journal)
    return write_site(tmp, site)


def real_shutdown(svc: ServiceProcess, nut: NutServer) -> None:
    """The outage as NUT plays it: on battery, and the mains do not return."""
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", on_battery(runtime=120))
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down", 120)
    finally:
        svc.stop()


@dataclass(frozen=True)
class Seen:
    """One shutdown, in seconds from the moment its site went on battery (after the
    debounce): when it finished, and when each resource's steps began and ended."""

    finished_s: float
    steps: dict[str, tuple[float, float]]

    def order(self) -> list[tuple[str, str]]:
        """Every pair (a, b) where a finished before b began."""
        return [
            (a, b)
            for a, (_, a_end) in self.steps.items()
            for b, (b_start, _) in self.steps.items()
            if a != b and a_end <= b_start
        ]


def _resource(step: str) -> str:
    """``stop:web/web-01`` -> ``web``: a group's member steps (live inventory) count as
    their group, the simulator's one step for it."""
    return step.partition(":")[2].partition("/")[0]


def _spans(rows: Iterable[tuple[str, float, float]]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for step, start, end in rows:
        rid = _resource(step)
        known = out.get(rid)
        out[rid] = (start, end) if known is None else (min(known[0], start), max(known[1], end))
    return out


def seen_in_journal(path: Path) -> tuple[Seen, RunRow]:
    journal = Journal(path)
    try:
        phases = journal.read.phases(limit=100)
        (run,) = [r for r in journal.read.runs() if r.kind == RunKind.SHUTDOWN]
    finally:
        journal.close()
    origin = parse_iso(next(p.at for p in phases if p.new == Phase.ON_BATTERY))

    def since(at: str) -> float:
        return (parse_iso(at) - origin).total_seconds()

    assert run.state == "done" and run.ended is not None, run
    steps = [(s.step, since(s.started), since(s.ended or s.started)) for s in run.steps]
    return Seen(since(run.ended), _spans(steps)), run


def seen_in_simulation(
    site_path: Path, durations: Durations | None = None
) -> tuple[Seen, SimulationReport]:
    """``upsguard simulate`` of the same site file (planned with ``durations`` when given):
    the mains fail and do not return."""
    site = load_site(site_path)
    events: list[Event] = []
    scenario = parse_scenario("outage: {at: 10s}\nhorizon: 1h", site)
    planner = Planner(site, durations=durations)
    simulation = Simulation(site, scenario, planner, observers=[events.append])
    report = run_virtual(simulation.run())
    origin = next(e.at for e in events if isinstance(e, PhaseChanged) and e.new is Phase.ON_BATTERY)

    def since(at: datetime) -> float:
        return (at - origin).total_seconds()

    started = {e.step: since(e.at) for e in events if isinstance(e, StepStarted)}
    steps = [
        (e.step, started[e.step], since(e.at))
        for e in events
        if isinstance(e, StepFinished) and e.step in started
    ]
    finished = next(
        e.at for e in events if isinstance(e, RunFinished) and e.spec.kind is RunKind.SHUTDOWN
    )
    return Seen(since(finished), _spans(steps)), report


def test_the_simulator_predicts_the_real_shutdown(
    tmp_path: Path, nut: NutServer, vcsim_factory: Any
) -> None:
    lab = timed_lab(vcsim_factory)
    svc = truth_site(tmp_path, nut, lab, estimates=True)
    real_shutdown(svc, nut)
    real, _ = seen_in_journal(svc.journal)
    predicted, report = seen_in_simulation(svc.site)

    assert report.ok, report.verdict
    ratio = real.finished_s / predicted.finished_s
    print(
        f"finish from on battery: real {real.finished_s:.2f} s, predicted "
        f"{predicted.finished_s:.2f} s (ratio {ratio:.3f})"
    )
    for rid in predicted.steps:
        print(f"  {rid:6} real {real.steps[rid]}  predicted {predicted.steps[rid]}")
    assert 1 - ALLOWED <= ratio <= 1 + ALLOWED
    assert real.steps.keys() == predicted.steps.keys()
    # in order, step by step: what the simulator runs one after the other, vSphere saw so
    assert predicted.order() and set(predicted.order()) <= set(real.order())


def test_one_real_run_teaches_the_plan_the_next_ones_duration(
    tmp_path: Path, nut_factory: Any, vcsim_factory: Any
) -> None:
    """The site file says nothing of durations (the defaults: minutes per step); one real
    run is journaled; what it taught plans the next run within 10 %."""
    journal = tmp_path / "learned.sqlite"
    first_nut: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    first = truth_site(
        tmp_path / "first", first_nut, timed_lab(vcsim_factory), estimates=False, journal=journal
    )
    real_shutdown(first, first_nut)

    site = load_site(first.site)
    configured = Planner(site).plan(Direction.SHUTDOWN).estimate_s
    read = Journal(journal)
    try:
        learned = learned_durations(read)
    finally:
        read.close()
    estimate = Planner(site, durations=learned).plan(Direction.SHUTDOWN).estimate_s

    second_nut: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    second = truth_site(tmp_path / "second", second_nut, timed_lab(vcsim_factory), estimates=False)
    real_shutdown(second, second_nut)
    real, run = seen_in_journal(second.journal)
    assert run.ended is not None
    took = (parse_iso(run.ended) - parse_iso(run.started)).total_seconds()

    print(
        f"next run took {took:.2f} s; plan from the site file {configured:.0f} s "
        f"(ratio {configured / took:.1f}), learned {estimate:.2f} s (ratio {estimate / took:.3f})"
    )
    assert 1 - ALLOWED <= estimate / took <= 1 + ALLOWED
    assert abs(estimate - took) < abs(configured - took)

    # and the dry run with what was learned predicts that run too
    predicted, report = seen_in_simulation(second.site, learned)
    assert report.ok, report.verdict
    assert 1 - ALLOWED <= real.finished_s / predicted.finished_s <= 1 + ALLOWED
