"""The real chain, end to end, with ``upsguard run`` as a process:

NUT (``dummy-ups`` + ``upsd``) plays the outage; upsguard flips a bcache cache (a copy of
bcache's sysfs whose dirty data drains, tests/fixtures/caches/fake_bcache.py) to
write-through, waits for its destage, shuts vcsim's VMs down in dependency order, then the
hosts; the data file brings power back; the startup runbook powers the hosts on through
their BMCs (pyghmi, which boot the host in vcsim) and the VMs in order, and the cache
returns to write-back. Order is read from vcsim's own events, not from upsguard's log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.caches.fake_bcache import Device, FakeBcacheSysfs
from tests.integration.test_service import ServiceProcess, write_site
from tests.peers.nut import NutServer
from tests.peers.vcsim import EventRecorder, Vcsim

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


def outage_then_back(seconds: int, runtime: int = 120) -> str:
    """A .dev script: on battery for ``seconds``, then on line for good, charge 80 %."""
    return (
        on_battery(runtime)
        + f"TIMER {seconds}\n"
        + "ups.status: OL CHRG\nbattery.charge: 80\nbattery.runtime: 1500\ninput.voltage: 230\n"
    )


@pytest.fixture
def nut(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    return server


@pytest.fixture
def bcache(tmp_path: Path) -> Iterator[FakeBcacheSysfs]:
    devices = {"bcache0": Device(dirty=500 * MiB, full_rate=100 * MiB)}
    with FakeBcacheSysfs(tmp_path / "sys", devices) as fake:
        yield fake


def chain_site(
    tmp_path: Path,
    nut: NutServer,
    lab: Vcsim,
    bmcs: dict[str, Any],
    bcache: FakeBcacheSysfs,
    **policies: Any,
) -> ServiceProcess:
    vc_password = tmp_path / "vc.pw"
    vc_password.write_text(lab.password + "\n")
    platforms: dict[str, Any] = {
        "vc": {
            "type": "vsphere",
            "host": lab.host,
            "port": lab.port,
            "user": lab.user,
            "password_file": str(vc_password),
            "ca_file": str(lab.tls.ca_file),
        }
    }
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
                    "provider": "bcache",
                    "sysfs_root": str(bcache.root),
                    "state_dir": str(tmp_path / "cache-state"),
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
        return [p.new for p in reversed(journal.phases(limit=100))]
    finally:
        journal.close()


def test_outage_caches_vms_hosts_then_power_back_and_startup_in_order(
    tmp_path: Path, nut: NutServer, lab: Vcsim, fake_bmc_factory: Any, bcache: FakeBcacheSysfs
) -> None:
    bmcs = bmcs_for(lab, fake_bmc_factory)
    svc = chain_site(tmp_path, nut, lab, bmcs, bcache)
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
        flipped_before = bcache.attr("bcache0", "cache_mode")
        assert flipped_before.startswith("writethrough [writeback]")
        nut.write("ups1", outage_then_back(40))
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down", 120)
        down_events = recorder.read()
        # the cache was clean before any host went down
        assert "bcache0" in bcache.clean_at
        svc.wait(lambda: svc.status()["phase"] == "normal", "the site to be back", 150)
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
    first_vm = min(i for i, (kind, _) in enumerate(later) if kind == "VmPoweredOnEvent")
    assert max(connected) < first_vm
    assert powered[:2] == ["dc01", "sql01"] and sorted(powered[2:]) == ["web-01", "web-02"]
    assert bcache.attr("bcache0", "cache_mode").startswith("writethrough [writeback]")
    journal = svc.read_journal()
    ops = [(o.mode, o.ok) for o in reversed(journal.cache_ops())]
    journal.close()
    assert ops == [("write-through", True), ("write-back", True)]
    assert phases(svc) == ["on_battery", "shutting_down", "down", "recovering", "normal"]
