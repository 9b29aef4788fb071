"""A whole home lab comes back after an outage, through the real planner and executor.

Peers, all on loopback: upsguard-vcsim (vCenter with three ESXi hosts, two of them
shut down), one pyghmi BMC per shut-down host (a power-on makes vcsim boot that
host), and a real sshd in front of two "devices", a switch and a NAS, each a
script that records its startup and turns "up" a moment later. The site says:
switch, then NAS, then the hosts (powered on through their BMCs, up once vSphere
sees them connected), then dc01, sql01 and the web VMs. The test checks that order
in the executor's events and at every peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.peers.bmc import FakeBmc
from tests.peers.sshd import Sshd
from tests.peers.vcsim import EventRecorder, Vcsim
from tests.runs import executor_for
from tests.sites import site_from
from upsguard.clock import SystemClock
from upsguard.config.resources import ResourceConfig
from upsguard.config.site import SiteConfig
from upsguard.events import Event, StepFinished, StepStarted
from upsguard.models import PlatformName, PowerState, StopMethod
from upsguard.plugins.registry import build_platforms
from upsguard.runbooks.planner import Planner

pytestmark = [pytest.mark.vcsim, pytest.mark.sshd, pytest.mark.timeout(240)]

HOSTS = {"esx0": "DC0_C0_H0", "esx1": "DC0_C0_H1"}
DOWN_VMS = ("dc01", "web-01", "sql01", "web-02")  # the VMs on those two hosts
HEALTH = {"timeout": "30s", "interval": "0.2s"}

DEVICE = """#!/bin/sh
dir=$(dirname "$0")
case "$1" in
  startup) echo "startup $(date +%s.%N)" >> "$dir/log"
           (sleep 0.5; echo on > "$dir/state"; echo "ready $(date +%s.%N)" >> "$dir/log") \
             >/dev/null 2>&1 & ;;
  status) test "$(cat "$dir/state")" = on ;;
esac
"""


class Device:
    """A switch or NAS behind sshd: ``startup`` flips it on 0.5 s later; ``status`` tells."""

    def __init__(self, base: Path) -> None:
        base.mkdir()
        self.script = base / "device.sh"
        self.script.write_text(DEVICE)
        self.script.chmod(0o755)
        (base / "state").write_text("off\n")
        self.log = base / "log"

    def times(self) -> dict[str, float]:
        rows = [line.split() for line in self.log.read_text().splitlines()]
        return {word: float(at) for word, at in rows}


def bring_lab_down(lab: Vcsim, site: SiteConfig) -> None:
    """The state after the outage: the two hosts and their VMs are off."""

    async def down() -> None:
        platforms = build_platforms(site, SystemClock())
        vc = platforms[PlatformName("vc")]
        await vc.open()
        try:
            for name in DOWN_VMS:
                [vm] = await vc.resolve(_vm(name))
                await vc.stop(vm, StopMethod.HARD)
                assert await vc.wait_for(vm, PowerState.OFF, 20)
            for rid in HOSTS:
                [host] = await vc.resolve(site.resource(rid))
                await vc.stop(host, StopMethod.GRACEFUL)
                assert await vc.wait_for(host, PowerState.OFF, 30)
        finally:
            await vc.close()

    asyncio.run(down())


def _vm(name: str) -> ResourceConfig:
    return ResourceConfig.model_validate({"id": name, "kind": "vm", "platform": "vc", "vm": name})


def homelab_site(
    tmp_path: Path, lab: Vcsim, sshd: Sshd, bmcs: dict[str, FakeBmc], sw: Device, nas: Device
) -> SiteConfig:
    ssh = {
        "type": "ssh",
        "user": sshd.user,
        "port": sshd.port,
        "key_file": str(sshd.key_file),
        "known_hosts": str(sshd.known_hosts),
        "poll_interval": "0.1s",
    }
    vc = lab.settings_dict(tmp_path)

    def device(rid: str, kind: str, dev: Device, **extra: Any) -> dict[str, Any]:
        return {
            "id": rid,
            "kind": kind,
            "platform": "ssh",
            "host": "127.0.0.1",
            "startup": f"{dev.script} startup",
            "status": f"{dev.script} status",
            "health": HEALTH,
            **extra,
        }

    resources: list[dict[str, Any]] = [
        device("core-sw", "switch", sw, start=True),
        device("nas01", "storage", nas, depends_on=["core-sw"]),
    ]
    for rid, host in HOSTS.items():
        resources.append(
            {
                "id": rid,
                "kind": "host",
                "platform": "vc",
                "host": host,
                "power_on_via": f"bmc-{rid}",
                "maintenance_mode": True,
                "depends_on": ["nas01"],
                "health": HEALTH,
            }
        )
    vm = {"kind": "vm", "platform": "vc", "health": HEALTH}
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
    platforms = {"vc": vc, "ssh": ssh}
    for rid, bmc in bmcs.items():
        platforms[f"bmc-{rid}"] = bmc.settings_dict(poll_interval="0.2s")
    return site_from(
        tmp_path,
        {
            "site": "homelab",
            "ups": [
                {"name": "ups1", "simulated": {}, "runtime_at": {"minutes": 20, "load_watts": 300}}
            ],
            "platforms": platforms,
            "resources": resources,
        },
    )


def test_home_lab_starts_in_the_planned_order(
    lab: Vcsim,
    sshd: Sshd,
    fake_bmc_factory: Callable[..., FakeBmc],
    tmp_path: Path,
) -> None:
    bmcs = {
        rid: fake_bmc_factory(
            power="off",
            power_on_delay=0.3,
            name=rid,
            power_on_url=f"https://{lab.host}:{lab.port}/upsguard/host-power-on?name={host}",
            ca_file=lab.tls.ca_file,
        )
        for rid, host in HOSTS.items()
    }
    sw, nas = Device(tmp_path / "sw"), Device(tmp_path / "nas")
    site = homelab_site(tmp_path, lab, sshd, bmcs, sw, nas)
    bring_lab_down(lab, site)
    recorder = EventRecorder(lab, "HostConnectedEvent", "VmPoweredOnEvent")

    events: list[Event] = []

    plan = Planner(site).plan("startup")

    async def startup() -> Any:
        platforms = build_platforms(site, SystemClock())
        for platform in platforms.values():
            await platform.open()
        try:
            return await executor_for(plan, platforms, SystemClock(), events.append).run()
        finally:
            for platform in platforms.values():
                await platform.close()

    result = asyncio.run(startup())
    assert result.outcome == "done", [o.detail for o in result.failed]

    # The executor's own record: each step starts only after what it waits for finished.
    started = {e.step: i for i, e in enumerate(events) if isinstance(e, StepStarted)}
    finished = {e.step: i for i, e in enumerate(events) if isinstance(e, StepFinished)}
    step_of = {str(s.resource): s.id for s in plan.steps}
    for before, after in [
        ("core-sw", "nas01"),
        ("nas01", "esx0"),
        ("nas01", "esx1"),
        ("esx0", "dc01"),
        ("esx1", "sql01"),
        ("dc01", "sql01"),
        ("sql01", "web"),
    ]:
        assert finished[step_of[before]] < started[step_of[after]], (before, after)

    # At the peers: each device came up (status turned on) before the next thing was powered.
    sw_times, nas_times = sw.times(), nas.times()
    assert sw_times["ready"] < nas_times["startup"]
    for bmc in bmcs.values():
        [(action, at)] = bmc.timed_actions()
        assert action == "on" and nas_times["ready"] < at

    # In vCenter: each VM powered on after its own host connected; VMs in dependency order.
    seen = recorder.read()
    powered = [name for kind, name in seen if kind == "VmPoweredOnEvent"]
    assert sorted(name for kind, name in seen if kind == "HostConnectedEvent") == sorted(
        HOSTS.values()
    )
    on_at = {name: i for i, (kind, name) in enumerate(seen) if kind == "VmPoweredOnEvent"}
    host_up = {name: i for i, (kind, name) in enumerate(seen) if kind == "HostConnectedEvent"}
    assert host_up[HOSTS["esx0"]] < on_at["dc01"]
    assert host_up[HOSTS["esx1"]] < on_at["sql01"]
    assert max(host_up.values()) < min(on_at["web-01"], on_at["web-02"])
    assert powered[:2] == ["dc01", "sql01"] and sorted(powered[2:]) == ["web-01", "web-02"]
