"""The service plans with live inventory: a cache gates the host a VM really runs on.

sql01's data goes through the cache ``flash``. The site file says sql01 runs on esx0 (it
moved since: vMotion, DRS); vcsim has it on esx1. Planning from the site file alone would
let esx1 power off while sql01's data may still be in the cache; the service plans from
live inventory, as ``plan --live`` does, so esx1 waits for the cache and esx0 does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.peers.nut import NutServer
from tests.peers.service import write_site
from tests.peers.vcsim import Vcsim, VmSpec, create_vm

pytestmark = [pytest.mark.nut, pytest.mark.vcsim, pytest.mark.timeout(240)]

ONLINE = "ups.status: OL\nbattery.charge: 100\nbattery.runtime: 1800\ninput.voltage: 230\n"
LOW = "ups.status: OB DISCHRG LB\nbattery.charge: 30\nbattery.runtime: 300\ninput.voltage: 0\n"


@pytest.fixture
def moved(vcsim_factory: Any) -> Vcsim:
    sim: Vcsim = vcsim_factory("-cluster", "1", "-host", "2", "-standalone-host", "0", "-vm", "0")
    create_vm(sim, VmSpec("sql01", "DC0_C0_H1"))
    return sim


def test_the_service_gates_the_host_a_vm_really_runs_on(
    tmp_path: Path, nut_factory: Any, moved: Vcsim
) -> None:
    nut: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    svc = write_site(
        tmp_path,
        {
            "site": "moved",
            "ups": [
                {"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}
            ],
            "platforms": {"vc": moved.settings_dict(tmp_path)},
            "caches": [
                {
                    "name": "flash",
                    "provider": "simulated",
                    "carries": ["sql01"],
                    "dirty": "200MiB",
                    "destage_rate": "40MiB/s",
                    "poll_interval": "200ms",
                }
            ],
            "resources": [
                {"id": "sql01", "kind": "vm", "platform": "vc", "runs_on": ["esx0"]},
                {"id": "esx0", "kind": "host", "platform": "vc", "host": "DC0_C0_H0"},
                {"id": "esx1", "kind": "host", "platform": "vc", "host": "DC0_C0_H1"},
            ],
            "policies": {"poll_interval": "500ms", "shutdown": {"when_any": ["low_battery"]}},
        },
    )
    try:
        svc.start()
        nut.write("ups1", LOW)
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down", 120)
        events = [e["text"] for e in svc.api().get("/events?after=0&limit=1000")["events"]]
    finally:
        svc.stop()
    waiting = [t for t in events if t.strip().startswith("waiting")]
    assert any("stop:esx1" in t and "flash" in t for t in waiting), events
    assert not any("stop:esx0" in t for t in waiting), events
