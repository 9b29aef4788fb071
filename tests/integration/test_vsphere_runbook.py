"""Whole runbooks through the executor against upsguard-vcsim: the order vSphere saw is the plan's.

The plan is built from live inventory (VM placement decides which host waits for which
VMs); the executor drives the vsphere platform; the order is read back from the
simulator's own event history, through collectors created before the run.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_vsphere_cli import LAB_RESOURCES, write_site
from tests.peers.vcsim import (
    LAB_ARGS,
    LAB_VMS,
    EventRecorder,
    Vcsim,
    VmSpec,
    create_vm,
    host_names,
    wait_for_tools,
)
from tests.runs import executor_for, outcomes_by_step
from upsguard.clock import SystemClock
from upsguard.config.loading import load_site
from upsguard.engine.executor import RunResult
from upsguard.engine.inventory import live_inventory
from upsguard.events import Event
from upsguard.models import StepState
from upsguard.plugins.registry import build_platforms
from upsguard.runbooks.planner import Planner

pytestmark = pytest.mark.vcsim

RESOURCES: list[dict[str, Any]] = [
    *LAB_RESOURCES[:4],
    {"id": "stray", "kind": "vm_group", "platform": "vc", "select": {"name": "stray-*"}},
    {"id": "stuck", "kind": "vm", "platform": "vc", "vm": "stuck-01", "guest_timeout": "1s"},
    *LAB_RESOURCES[4:],
]


@pytest.fixture
def slow_lab(vcsim_factory: Callable[..., Vcsim]) -> Vcsim:
    """The lab, with guests that take 300 ms to shut down and Tools 300 ms to start."""
    sim = vcsim_factory(*LAB_ARGS, "-guest-shutdown-ms", "300", "-tools-boot-ms", "300")
    for spec in LAB_VMS:
        create_vm(sim, spec)
    create_vm(sim, VmSpec("stuck-01", "DC0_C0_H2", guest_shutdown="hang"))
    wait_for_tools(sim)
    return sim


def run(site_path: Path, direction: str) -> tuple[RunResult, list[Event]]:
    site = load_site(site_path)
    events: list[Event] = []

    async def main() -> RunResult:
        platforms = build_platforms(site, SystemClock())
        for platform in platforms.values():
            await platform.open()
        try:
            inventory = await live_inventory(site, platforms)
            plan = Planner(site, inventory).plan(direction)
            return await executor_for(plan, platforms, SystemClock(), events.append).run()
        finally:
            for platform in platforms.values():
                await platform.close()

    return asyncio.run(main()), events


def before(seen: list[tuple[str, str]], first: tuple[str, str], then: tuple[str, str]) -> bool:
    return seen.index(first) < seen.index(then)


def test_shutdown_order_at_vsphere_follows_the_plan(slow_lab: Vcsim, tmp_path: Path) -> None:
    recorder = EventRecorder(
        slow_lab, "VmGuestShutdownEvent", "VmPoweredOffEvent", "HostShutdownEvent"
    )
    result, _ = run(write_site(slow_lab, tmp_path, RESOURCES), "shutdown")
    assert result.outcome == "done", [o.detail for o in result.failed]
    seen = recorder.read()
    off = {name: ("VmPoweredOffEvent", name) for kind, name in seen if kind == "VmPoweredOffEvent"}
    guest = {name: ("VmGuestShutdownEvent", name) for kind, name in seen if kind.startswith("VmG")}
    host = {name: ("HostShutdownEvent", name) for kind, name in seen if kind == "HostShutdownEvent"}
    # dependencies: web and app are down before sql01 is asked, sql01 before dc01
    for vm in ("web-01", "web-02", "app-01"):
        assert before(seen, off[vm], guest["sql01"])
    assert before(seen, off["sql01"], guest["dc01"])
    # placement: each host goes down after the VMs that ran on it
    placement = {
        "DC0_C0_H0": ["dc01", "web-01"],
        "DC0_C0_H1": ["sql01", "web-02"],
        "DC0_C0_H2": ["app-01", "stray-01", "stuck-01"],
    }
    for name, vms in placement.items():
        for vm in vms:
            assert before(seen, off[vm], host[name])
    # no Tools: no guest shutdown, powered off; a guest that hangs: powered off after 1s
    assert "app-01" not in guest and "stuck-01" in guest
    outcomes = outcomes_by_step(result)
    assert (
        outcomes["stop:stuck"].fallback_used
        and "still on after 1s" in outcomes["stop:stuck"].detail
    )
    assert outcomes["stop:app/app-01"].fallback_used
    assert all(h.runtime.powerState == "poweredOff" for h in slow_lab.all_hosts())


def test_power_up_order_after_the_outage(slow_lab: Vcsim, tmp_path: Path) -> None:
    """Hosts come back through their BMC (the simulator's stand-in, run as a command)."""
    url = f"https://127.0.0.1:{slow_lab.port}/upsguard/host-power-on?name="
    power_on = (
        f'{shlex.quote(sys.executable)} -c "import ssl, sys, urllib.request; '
        f"urllib.request.urlopen(urllib.request.Request(sys.argv[1], method='POST'), "
        f'context=ssl.create_default_context(cafile=sys.argv[2]))" '
    )
    resources = [dict(r) for r in RESOURCES]
    for res in resources:
        if res["kind"] == "host":
            res["power_on_via"] = "bmc"
            res["startup"] = power_on + shlex.join([url + res["id"], str(slow_lab.tls.ca_file)])
    site = write_site(slow_lab, tmp_path, resources, extra_platforms={"bmc": {"type": "command"}})
    down, _ = run(site, "shutdown")
    assert down.outcome == "done", [o.detail for o in down.failed]
    recorder = EventRecorder(slow_lab, "HostConnectedEvent", "VmPoweredOnEvent")
    up, _ = run(site, "startup")
    assert up.outcome == "done", [o.detail for o in up.failed]
    seen = recorder.read()
    on = [name for kind, name in seen if kind == "VmPoweredOnEvent"]
    hosts_up = [name for kind, name in seen if kind == "HostConnectedEvent"]
    assert sorted(hosts_up) == ["DC0_C0_H0", "DC0_C0_H1", "DC0_C0_H2"]
    assert seen.index(("VmPoweredOnEvent", on[0])) > max(
        seen.index(("HostConnectedEvent", h)) for h in hosts_up
    )
    assert on.index("dc01") < on.index("sql01")
    for vm in ("web-01", "web-02", "app-01"):
        assert on.index("sql01") < on.index(vm)
    assert slow_lab.vm("web-01").guest.toolsRunningStatus == "guestToolsRunning"
    assert not any(h.runtime.inMaintenanceMode for h in slow_lab.all_hosts())
    assert StepState.DONE in {o.state for o in up.outcomes.values()}


def test_hand_over_to_the_esxi_host_once_vcenter_is_down(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path
) -> None:
    """vCenter's own VM stops last; its host is then shut down through ESXi directly.

    A second simulator in ESX mode plays DC0_C0_H0, where the vCenter VM runs.
    """
    vc = vcsim_factory("-cluster", "1", "-host", "2", "-standalone-host", "0", "-vm", "0")
    esx = vcsim_factory("-vm", "0", esx=True)
    create_vm(vc, VmSpec("vcsa", "DC0_C0_H0"))
    create_vm(vc, VmSpec("app-01", "DC0_C0_H1"))
    create_vm(esx, VmSpec("vcsa", host_names(esx)[0]))
    (tmp_path / "esx.pw").write_text(esx.password)
    resources: list[dict[str, Any]] = [
        {"id": "app", "kind": "vm", "platform": "vc", "vm": "app-01"},
        {"id": "vcenter", "kind": "vm", "platform": "vc", "vm": "vcsa", "serves_platform": "vc"},
        {"id": "DC0_C0_H0", "kind": "host", "platform": "vc"},
        {"id": "DC0_C0_H1", "kind": "host", "platform": "vc"},
    ]
    site = write_site(
        vc,
        tmp_path,
        resources,
        direct_hosts={
            "user": esx.user,
            "password_file": str(tmp_path / "esx.pw"),
            "ca_file": str(esx.tls.ca_file),
        },
        direct_addresses={"DC0_C0_H0": f"127.0.0.1:{esx.port}"},
    )
    at_vc = EventRecorder(vc, "VmGuestShutdownEvent", "HostShutdownEvent")
    at_esx = EventRecorder(esx, "VmGuestShutdownEvent", "HostShutdownEvent")
    result, _ = run(site, "shutdown")
    assert result.outcome == "done", [o.detail for o in result.failed]
    assert at_vc.read() == [
        ("VmGuestShutdownEvent", "app-01"),
        ("HostShutdownEvent", "DC0_C0_H1"),
    ]
    assert at_esx.read() == [
        ("VmGuestShutdownEvent", "vcsa"),
        ("HostShutdownEvent", host_names(esx)[0]),
    ]


def test_vcenter_that_hangs_mid_run_hands_the_hosts_left_to_esxi(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path
) -> None:
    """vCenter freezes (SIGSTOP) once the VMs are down: both host steps left go to the ESXi
    hosts directly once vCenter has been silent for ``vcenter_silent_after``.

    A command step between the VM and the host steps freezes it, so the moment is the
    plan's, not a race; two simulators in ESX mode play the two hosts.
    """
    vc = vcsim_factory("-cluster", "1", "-host", "2", "-standalone-host", "0", "-vm", "0")
    esx = [vcsim_factory("-vm", "0", esx=True) for _ in range(2)]
    create_vm(vc, VmSpec("app-01", "DC0_C0_H0"))
    (tmp_path / "esx.pw").write_text(esx[0].password)
    resources: list[dict[str, Any]] = [
        {"id": "app", "kind": "vm", "platform": "vc", "vm": "app-01", "depends_on": ["freeze"]},
        {
            "id": "freeze",
            "kind": "command",
            "platform": "command",
            "shutdown": f"kill -STOP {vc.process.pid}",
            "depends_on": ["DC0_C0_H0", "DC0_C0_H1"],
        },
        {"id": "DC0_C0_H0", "kind": "host", "platform": "vc"},
        {"id": "DC0_C0_H1", "kind": "host", "platform": "vc"},
    ]
    site = write_site(
        vc,
        tmp_path,
        resources,
        direct_hosts={
            "user": esx[0].user,
            "password_file": str(tmp_path / "esx.pw"),
            "ca_file": str(esx[0].tls.ca_file),
        },
        direct_addresses={f"DC0_C0_H{i}": f"127.0.0.1:{sim.port}" for i, sim in enumerate(esx)},
        vcenter_silent_after="2s",
    )
    at_vc = EventRecorder(vc, "VmGuestShutdownEvent")
    at_esx = [EventRecorder(sim, "HostShutdownEvent") for sim in esx]
    try:
        result, _ = run(site, "shutdown")
    finally:
        os.kill(vc.process.pid, signal.SIGCONT)
        # the calls left to the frozen vCenter now get their answers: let them end while it
        # still answers, so that no connection is left open
        for thread in threading.enumerate():
            if thread.name.startswith("vsphere-"):
                thread.join(60)
    assert result.outcome == "done", [o.detail for o in result.failed]
    assert at_vc.read() == [("VmGuestShutdownEvent", "app-01")]
    for sim, recorder in zip(esx, at_esx, strict=True):
        assert recorder.read() == [("HostShutdownEvent", host_names(sim)[0])]
        assert all(h.runtime.powerState == "poweredOff" for h in sim.all_hosts())
