"""``kill -9`` while vSphere is shutting hosts down: the restarted service finds the host
shutdowns still under way and waits for them instead of asking again.

A host whose ShutdownHost task runs still reads powered on, so re-checking its state alone
does not tell that the step was already asked. upsguard-vcsim makes each ShutdownHost take
8 s (``-method-delay ShutdownHost:8000``) and keeps every task in the host's ``recentTask``:
what each host was asked is read there and in vcsim's events, not in upsguard's journal.
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


def site(tmp: Path, nut: NutServer, sim: Vcsim) -> ServiceProcess:
    vm = {"kind": "vm", "platform": "vc", "guest_timeout": "60s"}
    resources: list[dict[str, Any]] = [
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


def shutdown_tasks(sim: Vcsim, host: str) -> list[str]:
    """The states of the ShutdownHost tasks vSphere lists for ``host``."""
    tasks = sim.host_system(host).recentTask or []
    return [str(t.info.state) for t in tasks if t.info.descriptionId == HOST_SHUTDOWN]


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
        assert all(shutdown_tasks(slow_hosts, h) == ["running"] for h in together)
        svc.start()
        assert svc.status()["service"]["resumed"]
        svc.wait(lambda: svc.status()["phase"] == "down", "the resumed run to finish", 120)
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
    (run,) = journal.runs()
    journal.close()
    assert (run.state, run.resumed) == ("done", 1)
    details = {s.step: s.detail for s in run.steps if s.state == "done"}
    for rid in ("esx0", "esx1"):
        assert "under way" in details[f"stop:{rid}"], details
