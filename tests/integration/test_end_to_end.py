"""The real chain, end to end, with ``upsguard run`` as a process:

NUT (``dummy-ups`` + ``upsd``) plays the outage; upsguard flips a write-back cache (a
``command`` cache around the fake vendor CLI of tests/fixtures/caches/bin, whose dirty data
drains over wall time; real kernel caches are in tests/integration/test_guest_outage.py) to
write-through, waits for its destage, shuts vcsim's VMs down in dependency order, then the
hosts; the data file brings power back; the startup runbook powers the hosts on through
their BMCs (pyghmi, which boot the host in vcsim) and the VMs in order, and the cache
returns to write-back. Order is read from vcsim's own events, not from upsguard's log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import polls_pass
from tests.fixtures.caches.tools import FakeTools
from tests.peers.nut import NutServer
from tests.peers.service import ServiceProcess, write_site
from tests.peers.vcsim import EventRecorder, Vcsim, wait_task

pytestmark = [pytest.mark.nut, pytest.mark.vcsim, pytest.mark.timeout(300)]

MiB = 1024 * 1024
HOSTS = {"esx0": "DC0_C0_H0", "esx1": "DC0_C0_H1"}
ONLINE = (
    "ups.status: OL\nbattery.charge: 100\nbattery.runtime: 1800\nups.load: 30\ninput.voltage: 230\n"
)


def on_battery(runtime: int, charge: int = 60, extra: str = "") -> str:
    return (
        f"ups.status: OB DISCHRG{extra}\nbattery.charge: {charge}\nbattery.runtime: {runtime}\n"
        "ups.load: 30\ninput.voltage: 0\n"
    )


BACK = "ups.status: OL CHRG\nbattery.charge: 80\nbattery.runtime: 1500\ninput.voltage: 230\n"
"""The mains back for good, the battery charged enough to start up."""


def outage_then_back(seconds: int, runtime: int = 120) -> str:
    """A .dev script: on battery for ``seconds``, then ``BACK``."""
    return on_battery(runtime) + f"TIMER {seconds}\n" + BACK


@pytest.fixture
def nut(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    return server


@pytest.fixture
def cache(tmp_path: Path) -> FakeTools:
    device = {"dirty": 1000 * MiB, "rate": 100 * MiB, "accepting": True}  # 10 s to destage
    return FakeTools(tmp_path / "cache-bin", {"flash0": device})


def cache_ops(svc: ServiceProcess) -> list[tuple[str, bool]]:
    """The cache flips the journal holds, oldest first: (mode, ok)."""
    journal = svc.read_journal()
    try:
        return [(o.mode, o.ok) for o in reversed(journal.read.cache_ops())]
    finally:
        journal.close()


def chain_site(
    tmp_path: Path,
    nut: NutServer,
    lab: Vcsim,
    bmcs: dict[str, Any],
    cache: FakeTools,
    **policies: Any,
) -> ServiceProcess:
    platforms: dict[str, Any] = {"vc": lab.settings_dict(tmp_path)}
    cli = cache.path("fakecache")
    health = {"timeout": "60s", "interval": "0.3s"}
    resources: list[dict[str, Any]] = []
    for rid, host in HOSTS.items():
        platforms[f"bmc-{rid}"] = bmcs[rid].settings_dict(poll_interval="0.3s")
        resources.append(
            {
                "id": rid,
                "kind": "host",
                "platform": "vc",
                "host": host,
                "power_on_via": f"bmc-{rid}",
                "health": health,
            }
        )
    vm = {"kind": "vm", "platform": "vc", "guest_timeout": "60s", "health": health}
    resources += [
        {"id": "dc01", **vm, "runs_on": ["esx0"]},
        {"id": "sql01", **vm, "runs_on": ["esx1"], "depends_on": ["dc01"]},
        {
            "id": "web",
            **vm,
            "kind": "vm_group",
            "select": {"name": "web-*"},
            "runs_on": ["esx0", "esx1"],
            "depends_on": ["sql01"],
        },
    ]
    return write_site(
        tmp_path,
        {
            "site": "chain",
            "ups": [
                {"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}
            ],
            "platforms": platforms,
            "caches": [
                {
                    "name": "flash",
                    "provider": "command",
                    "targets": ["flash0"],
                    "read_mode": f"{cli} mode {{target}}",
                    "set_write_through": f"{cli} set {{target}} wt",
                    "set_write_back": f"{cli} set {{target}} wb",
                    "read_dirty_bytes": f"{cli} dirty {{target}}",
                    "carries": ["sql01"],
                    "poll_interval": "0.2s",
                }
            ],
            "resources": resources,
            "policies": {
                "poll_interval": "500ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery", "runtime < plan + 10m"]},
                "power_returns": {"online_for": "2s"},
                "startup": {"online_for": "2s", "charge_above": 50},
                **policies,
            },
        },
    )


def nut_entry(nut: NutServer) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}


def bmcs_for(lab: Vcsim, fake_bmc_factory: Any) -> dict[str, Any]:
    return {
        rid: fake_bmc_factory(
            power="off",  # what the BMC reads once vSphere shut its host down
            name=rid,
            power_on_url=f"https://{lab.host}:{lab.port}/upsguard/host-power-on?name={host}",
            ca_file=lab.tls.ca_file,
        )
        for rid, host in HOSTS.items()
    }


def phases(svc: ServiceProcess) -> list[str]:
    journal = svc.read_journal()
    try:
        return [p.new for p in reversed(journal.read.phases(limit=100))]
    finally:
        journal.close()


def test_outage_caches_vms_hosts_then_power_back_and_startup_in_order(
    tmp_path: Path, nut: NutServer, lab: Vcsim, fake_bmc_factory: Any, cache: FakeTools
) -> None:
    bmcs = bmcs_for(lab, fake_bmc_factory)
    svc = chain_site(tmp_path, nut, lab, bmcs, cache)
    recorder = EventRecorder(
        lab,
        "VmGuestShutdownEvent",
        "VmPoweredOffEvent",
        "HostShutdownEvent",
        "HostConnectedEvent",
        "VmPoweredOnEvent",
    )
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        assert cache.device("flash0")["accepting"]  # write-back
        nut.write("ups1", outage_then_back(40))
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down", 120)
        down_events = recorder.read()
        # the cache was clean before any host went down
        assert cache.device("flash0")["dirty"] == 0
        svc.wait(lambda: svc.status()["phase"] == "normal", "the site to be back", 150)
        svc.wait(lambda: len(cache_ops(svc)) == 2, "the flip back to write-back journaled")
        seen = recorder.read()
    finally:
        svc.stop()

    shutdowns = [name for kind, name in down_events if kind == "VmGuestShutdownEvent"]
    assert sorted(shutdowns[:2]) == ["web-01", "web-02"]
    assert shutdowns[2:] == ["sql01", "dc01"]
    host_down = [i for i, (kind, _) in enumerate(down_events) if kind == "HostShutdownEvent"]
    last_vm = max(i for i, (kind, _) in enumerate(down_events) if kind == "VmGuestShutdownEvent")
    assert sorted(down_events[i][1] for i in host_down) == sorted(HOSTS.values())
    assert min(host_down) > last_vm

    later = seen[len(down_events) :]
    connected = [i for i, (kind, _) in enumerate(later) if kind == "HostConnectedEvent"]
    powered = [name for kind, name in later if kind == "VmPoweredOnEvent"]
    assert sorted(later[i][1] for i in connected) == sorted(HOSTS.values())
    at = {name: i for i, (kind, name) in enumerate(later) if kind == "VmPoweredOnEvent"}
    host_up = {name: i for i, (kind, name) in enumerate(later) if kind == "HostConnectedEvent"}
    # each VM starts only once the host it runs on is connected again
    assert host_up[HOSTS["esx0"]] < at["dc01"]
    assert host_up[HOSTS["esx1"]] < at["sql01"]
    assert max(host_up.values()) < min(at["web-01"], at["web-02"])
    assert powered[:2] == ["dc01", "sql01"] and sorted(powered[2:]) == ["web-01", "web-02"]
    assert cache.device("flash0")["accepting"]  # write-back again
    assert cache_ops(svc) == [("write-through", True), ("write-back", True)]
    assert phases(svc) == ["on_battery", "shutting_down", "down", "recovering", "normal"]


def test_a_vm_off_before_the_outage_stays_off_after_it(
    tmp_path: Path, nut: NutServer, lab: Vcsim, fake_bmc_factory: Any, cache: FakeTools
) -> None:
    """sql01 was powered off by hand before the outage: the shutdown finds it off, and the
    startup (``guests: as_before``) brings the site back as it was, every other VM on and
    sql01 off."""
    wait_task(lab.vm("sql01").PowerOffVM_Task())
    bmcs = bmcs_for(lab, fake_bmc_factory)
    as_before = {"online_for": "2s", "charge_above": 50, "guests": "as_before"}
    svc = chain_site(tmp_path, nut, lab, bmcs, cache, startup=as_before)
    recorder = EventRecorder(lab, "HostConnectedEvent", "VmPoweredOnEvent")
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", outage_then_back(40))
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down", 120)
        svc.wait(lambda: svc.status()["phase"] == "normal", "the site to be back", 150)
    finally:
        svc.stop()
    assert sorted(recorder.names("VmPoweredOnEvent")) == ["dc01", "web-01", "web-02"]
    assert lab.vm("sql01").runtime.powerState == "poweredOff"
    journal = svc.read_journal()
    try:
        shutdown, startup = reversed(journal.read.runs())
    finally:
        journal.close()
    found = {s.step: s for s in shutdown.steps}["stop:sql01"]
    left = {s.step: s for s in startup.steps}["start:sql01"]
    assert (found.state, found.already_there) == ("done", True)
    assert (startup.state, left.state) == ("done", "skipped")
    assert left.detail.startswith(f"left off: sql01 was already off when run {shutdown.id}")


def test_power_back_after_the_point_of_no_return_finishes_then_starts_up(
    tmp_path: Path, nut: NutServer, lab: Vcsim, fake_bmc_factory: Any, cache: FakeTools
) -> None:
    """Mains return while esx1 waits for the cache to drain, after esx0 went down."""
    bmcs = bmcs_for(lab, fake_bmc_factory)
    svc = chain_site(tmp_path, nut, lab, bmcs, cache)
    recorder = EventRecorder(lab, "HostShutdownEvent", "HostConnectedEvent", "VmPoweredOnEvent")
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", on_battery(runtime=120))
        svc.wait(lambda: HOSTS["esx0"] in recorder.names("HostShutdownEvent"), "esx0 down", 60)
        nut.write("ups1", BACK)  # esx1 still waits for the cache to drain
        svc.wait(
            lambda: svc.status()["phase"] == "normal" and "recovering" in phases(svc),
            "the site to be back",
            150,
        )
    finally:
        svc.stop()
    seen = recorder.read()
    kinds = [kind for kind, _ in seen]
    assert kinds.count("HostShutdownEvent") == 2  # the shutdown finished
    assert kinds.index("HostConnectedEvent") > max(
        i for i, k in enumerate(kinds) if k == "HostShutdownEvent"
    )
    assert phases(svc) == ["on_battery", "shutting_down", "down", "recovering", "normal"]
    journal = svc.read_journal()
    runs = [(r.kind, r.state) for r in reversed(journal.read.runs(with_steps=False))]
    journal.close()
    assert runs == [("shutdown", "done"), ("startup", "done")]


@pytest.fixture
def slow_lab(vcsim_factory: Any) -> Vcsim:
    """The lab with VMs whose guests take a while to shut down."""
    from tests.peers.vcsim import LAB_ARGS, VmSpec, create_vm

    sim: Vcsim = vcsim_factory(*LAB_ARGS)
    for spec in (
        VmSpec("dc01", "DC0_C0_H0", guest_shutdown="2000"),
        VmSpec("sql01", "DC0_C0_H1", guest_shutdown="4000"),
        VmSpec("web-01", "DC0_C0_H0", guest_shutdown="6000"),
        VmSpec("web-02", "DC0_C0_H1", guest_shutdown="6000"),
    ):
        create_vm(sim, spec)
    return sim


def test_power_back_before_the_point_of_no_return_cancels_and_restarts_in_order(
    tmp_path: Path,
    nut: NutServer,
    slow_lab: Vcsim,
    fake_bmc_factory: Any,
    cache: FakeTools,
) -> None:
    bmcs = bmcs_for(slow_lab, fake_bmc_factory)
    svc = chain_site(tmp_path, nut, slow_lab, bmcs, cache)
    recorder = EventRecorder(
        slow_lab,
        "VmGuestShutdownEvent",
        "VmPoweredOffEvent",
        "HostShutdownEvent",
        "VmPoweredOnEvent",
    )
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", on_battery(runtime=120))
        svc.wait(lambda: len(recorder.names("VmGuestShutdownEvent")) == 2, "web guests asked", 60)
        nut.write("ups1", BACK)  # while they shut down (6 s each): before the point of no return
        svc.wait(lambda: "recovering" in phases(svc), "the cancel", 60)
        svc.wait(lambda: svc.status()["phase"] == "normal", "the site to be back", 120)
    finally:
        svc.stop()
    seen = recorder.read()
    kinds = [kind for kind, _ in seen]
    assert "HostShutdownEvent" not in kinds
    stopped = sorted(name for kind, name in seen if kind == "VmGuestShutdownEvent")
    assert stopped == ["web-01", "web-02"]  # sql01 and dc01 were never asked
    on = [name for kind, name in seen if kind == "VmPoweredOnEvent"]
    assert sorted(on) == ["web-01", "web-02"]
    for vm in on:  # each guest under way landed, then came back (each at its own pace)
        assert seen.index(("VmPoweredOffEvent", vm)) < seen.index(("VmPoweredOnEvent", vm)), seen
    assert phases(svc)[:3] == ["on_battery", "shutting_down", "recovering"]
    journal = svc.read_journal()
    runs = [(r.kind, r.state) for r in reversed(journal.read.runs(with_steps=False))]
    journal.close()
    assert runs == [("shutdown", "cancelled"), ("startup", "done")]


def test_flapping_mains_start_no_runbook_and_no_cache_thrash(
    tmp_path: Path, nut_factory: Any, lab: Vcsim, fake_bmc_factory: Any, cache: FakeTools
) -> None:
    flap = on_battery(900, charge=95) + "TIMER 3\n" + ONLINE + "TIMER 3\n"
    nut: NutServer = nut_factory({"ups1": flap}, ext="seq")
    bmcs = bmcs_for(lab, fake_bmc_factory)
    svc = chain_site(
        tmp_path, nut, lab, bmcs, cache, poll_interval="1s", on_battery={"after": "10s"}
    )
    recorder = EventRecorder(lab, "VmGuestShutdownEvent", "VmPoweredOffEvent")
    try:
        svc.start()
        polls_pass(svc, 20)  # about three flaps of 6 s, counted by the service's own polls
        st = svc.status()
    finally:
        svc.stop()
    journal = svc.read_journal()
    statuses = {r.status for r in journal.read.readings(limit=500)}
    ops, runs = journal.read.cache_ops(), journal.read.runs()
    journal.close()
    assert "DISCHRG OB" in statuses and "OL" in statuses  # the flapping was seen
    assert st["phase"] == "normal" and runs == [] and ops == []
    assert cache.device("flash0")["accepting"]  # write-back again
    assert recorder.read() == []


def test_upsd_killed_on_battery_keeps_counting_down_and_shuts_down(
    tmp_path: Path, nut: NutServer
) -> None:
    svc = write_site(
        tmp_path,
        {
            "site": "lost",
            "ups": [{"name": "ups1", "nut": nut_entry(nut)}],
            "platforms": {"sim": {"type": "simulated", "guest_shutdown": "1s"}},
            "resources": [{"id": "vm1", "kind": "vm", "platform": "sim"}],
            "policies": {
                "poll_interval": "500ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery", "runtime < 140s"]},
            },
        },
    )
    try:
        svc.start()
        nut.write("ups1", on_battery(runtime=150))
        svc.wait(lambda: svc.status()["phase"] == "on_battery", "on battery")
        nut.kill_upsd()
        svc.wait(lambda: svc.status()["ups"][0].get("link") == "lost", "the link to be lost")
        assert svc.status()["phase"] == "on_battery"  # lost is not back on line
        svc.wait(lambda: svc.status()["phase"] == "down", "the countdown to shut down", 60)
    finally:
        svc.stop()
    journal = svc.read_journal()
    moves = [(p.new, p.reason) for p in reversed(journal.read.phases())]
    readings = list(reversed(journal.read.readings(limit=500)))
    journal.close()
    assert moves[1][0] == "shutting_down"
    assert moves[1][1].startswith("runtime < 140s: runtime ")  # the figures it was made on
    assert "recovering" not in [m[0] for m in moves]
    first_lost = next(i for i, r in enumerate(readings) if r.link == "lost")
    assert all(r.status == "DISCHRG OB" for r in readings[first_lost:])


def test_service_killed_mid_shutdown_restarts_and_finishes_without_repeating_steps(
    tmp_path: Path,
    nut: NutServer,
    slow_lab: Vcsim,
    fake_bmc_factory: Any,
    cache: FakeTools,
) -> None:
    bmcs = bmcs_for(slow_lab, fake_bmc_factory)
    svc = chain_site(tmp_path, nut, slow_lab, bmcs, cache)
    recorder = EventRecorder(slow_lab, "VmGuestShutdownEvent", "HostShutdownEvent")
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", on_battery(runtime=120))  # and it does not come back

        def sql01_running() -> bool:
            run = svc.status()["run"] or {}
            return [s["step"] for s in run.get("running", [])] == ["stop:sql01"]

        svc.wait(sql01_running, "stop:sql01 to be under way", 60)
        svc.kill9()
        svc.resume_to_the_end()
    finally:
        svc.stop()
    seen = recorder.read()
    asked = [name for kind, name in seen if kind == "VmGuestShutdownEvent"]
    assert asked.count("web-01") == 1 and asked.count("web-02") == 1  # done before the kill
    assert asked.count("dc01") == 1
    assert asked.count("sql01") == 1  # under way at the kill: waited for, not asked again
    hosts = sorted(name for kind, name in seen if kind == "HostShutdownEvent")
    assert hosts == sorted(HOSTS.values())
    journal = svc.read_journal()
    (run,) = journal.read.runs()
    journal.close()
    assert (run.state, run.resumed) == ("done", 1)
    done_once = [s.step for s in run.steps if s.state == "done"]
    assert sorted(done_once) == sorted(set(done_once))  # no step finished twice
