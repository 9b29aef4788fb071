"""``kill -9`` while vSphere is shutting hosts or VMs down: the restarted service waits for
the requests still under way instead of asking again.

A host whose ShutdownHost task runs, a VM whose power-off task runs or whose guest is
shutting down, all still read powered on, so re-checking the state alone does not tell
that the step was already asked. upsguard-vcsim makes each take 8 s (``-method-delay
ShutdownHost:8000,PowerOff:8000``, a guest that takes 8 s to shut down) and keeps every
task in its entity's ``recentTask``: what each was asked is read there and in vcsim's
events, not in upsguard's journal.

Whether the restarted service still finds a request under way or finds its target off
already depends on how long the restart took (a busy machine takes longer than 8 s): both are
right, and the tests accept both. What they fail on is the defect they guard: a target asked
twice, counted at vcsim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import LOW_BATTERY, ONLINE
from tests.peers.nut import NutServer
from tests.peers.service import ServiceProcess, write_site
from tests.peers.vcsim import LAB_ARGS, EventRecorder, Vcsim, VmSpec, create_vm, wait_for_tools

pytestmark = [pytest.mark.nut, pytest.mark.vcsim, pytest.mark.timeout(300)]

HOST_SHUTDOWN = "HostSystem.shutdown"  # vSphere's descriptionId of ShutdownHost_Task
VM_POWER_OFF = "VirtualMachine.powerOff"
#: esx0 and esx1 go down together, esx2 (which they depend on) after both.
HOSTS = {"esx0": "DC0_C0_H0", "esx1": "DC0_C0_H1", "esx2": "DC0_C0_H2"}
VMS = (VmSpec("dc01", "DC0_C0_H0"), VmSpec("sql01", "DC0_C0_H1"))


@pytest.fixture
def nut(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    return server


@pytest.fixture
def slow_hosts(vcsim_factory: Any) -> Vcsim:
    """The lab's three hosts, each taking 8 s to shut down once asked."""
    sim: Vcsim = vcsim_factory(*LAB_ARGS, "-method-delay", "ShutdownHost:8000")
    for spec in VMS:
        create_vm(sim, spec)
    wait_for_tools(sim)
    return sim


def site(
    tmp: Path, nut: NutServer, sim: Vcsim, vms: tuple[str, ...] = (), hosts: bool = True
) -> ServiceProcess:
    """sql01 before dc01, then the hosts (esx0 and esx1 before esx2); or ``vms`` alone."""
    vm = {"kind": "vm", "platform": "vc", "guest_timeout": "60s"}
    resources: list[dict[str, Any]] = [{"id": name, **vm} for name in vms]
    if hosts:
        resources = [
            {"id": "sql01", **vm, "runs_on": ["esx1"], "depends_on": ["dc01"]},
            {"id": "dc01", **vm, "runs_on": ["esx0"]},
            *(
                {"id": rid, "kind": "host", "platform": "vc", "host": name, "guest_timeout": "2m"}
                for rid, name in HOSTS.items()
            ),
        ]
        for host in resources[2:4]:
            host["depends_on"] = ["esx2"]
    return write_site(
        tmp,
        {
            "site": "inflight",
            "ups": [
                {"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}
            ],
            "platforms": {"vc": sim.settings_dict(tmp)},
            "resources": resources,
            "policies": {
                "poll_interval": "500ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery"]},
            },
        },
    )


def tasks_of(entity: Any, action: str) -> list[str]:
    """The states of the ``action`` tasks vSphere lists for ``entity``."""
    return [str(t.info.state) for t in entity.recentTask or [] if t.info.descriptionId == action]


def shutdown_tasks(sim: Vcsim, host: str) -> list[str]:
    return tasks_of(sim.host_system(host), HOST_SHUTDOWN)


def test_kill_9_during_host_shutdowns_asks_each_host_once_and_keeps_the_order(
    tmp_path: Path, nut: NutServer, slow_hosts: Vcsim
) -> None:
    svc = site(tmp_path, nut, slow_hosts)
    recorder = EventRecorder(slow_hosts, "VmGuestShutdownEvent", "HostShutdownEvent")
    together = [HOSTS["esx0"], HOSTS["esx1"]]
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", LOW_BATTERY)
        svc.wait(
            lambda: all("running" in shutdown_tasks(slow_hosts, h) for h in together),
            "both host shutdowns to be under way",
            120,
        )
        svc.kill9()
        svc.resume_to_the_end()
    finally:
        svc.stop()

    asked = {rid: shutdown_tasks(slow_hosts, name) for rid, name in HOSTS.items()}
    assert asked == {rid: ["success"] for rid in HOSTS}
    seen = recorder.read()
    down = [name for kind, name in seen if kind == "HostShutdownEvent"]
    assert sorted(down[:2]) == sorted(together) and down[2:] == [HOSTS["esx2"]]
    guests = [name for kind, name in seen if kind == "VmGuestShutdownEvent"]
    assert guests == ["sql01", "dc01"]
    assert [kind for kind, _ in seen[:2]] == ["VmGuestShutdownEvent"] * 2
    journal = svc.read_journal()
    (run,) = journal.read.runs()
    journal.close()
    assert (run.state, run.resumed) == ("done", 1)
    # each resumed step says "under way before the restart" or "already off", as fast as the
    # restart was: either is right, so the words are shown, not asserted
    steps = {s.step: (s.state, s.detail) for s in run.steps}
    assert all(state == "done" for state, _ in steps.values()), steps


@pytest.fixture
def slow_vms(vcsim_factory: Any) -> Vcsim:
    """dc01's guest takes 8 s to shut down; app01 has no VMware Tools and its power-off
    task takes 8 s."""
    sim: Vcsim = vcsim_factory(*LAB_ARGS, "-method-delay", "PowerOff:8000")
    create_vm(sim, VmSpec("dc01", "DC0_C0_H0", guest_shutdown="8000"))
    create_vm(sim, VmSpec("app01", "DC0_C0_H1", tools=False))
    wait_for_tools(sim)
    return sim


def test_kill_9_during_a_guest_shutdown_and_a_power_off_asks_each_vm_once(
    tmp_path: Path, nut: NutServer, slow_vms: Vcsim
) -> None:
    svc = site(tmp_path, nut, slow_vms, vms=("dc01", "app01"), hosts=False)
    recorder = EventRecorder(slow_vms, "VmGuestShutdownEvent", "VmPoweredOffEvent")

    def both_under_way() -> bool:
        shutting_down = slow_vms.vm("dc01").guest.guestState == "shuttingDown"
        return shutting_down and "running" in tasks_of(slow_vms.vm("app01"), VM_POWER_OFF)

    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", LOW_BATTERY)
        svc.wait(both_under_way, "the guest shutdown and the power-off to be under way", 120)
        svc.kill9()
        svc.resume_to_the_end()
    finally:
        svc.stop()

    assert recorder.names("VmGuestShutdownEvent") == ["dc01"]
    assert tasks_of(slow_vms.vm("app01"), VM_POWER_OFF) == ["success"]
    assert sorted(recorder.names("VmPoweredOffEvent")) == ["app01", "dc01"]
    journal = svc.read_journal()
    (run,) = journal.read.runs()
    journal.close()
    assert (run.state, run.resumed) == ("done", 1)
    # each resumed step says "under way before the restart" or "already off", as fast as the
    # restart was: either is right, so the words are shown, not asserted
    steps = {s.step: (s.state, s.detail) for s in run.steps}
    assert all(state == "done" for state, _ in steps.values()), steps
