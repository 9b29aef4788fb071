"""The cluster example (config/examples/cluster.yaml) on the test peers, all on loopback.

Its structure is the example's, entry for entry; only what points outside this machine is
pointed at a peer: ``ups-a`` at snmpsim (SNMPv3, SHA and AES, the ``ups-mib`` agent),
``ups-b`` at a real upsd with STARTTLS serving ``smt3000`` through the stand-in driver
(``nut_driver``: it offers shutdown.return and the battery test commands) and ``dummy``
through dummy-ups (load.off alone), ``vcenter`` at upsguard-vcsim (three hosts, the
example's VMs placed and tagged as its selectors want, VMware Tools running, and a user of
limited privileges), the Redfish BMCs at sushy-emulator, the IPMI BMCs at pyghmi's fake
BMC, ``storage-ssh`` (and ``mgmt01``) at the test sshd, the FVP cache at the fake ``pwsh``,
and every file under ``/etc/upsguard`` at a file of the lab.

``ClusterLab.site_data()`` gives a fresh copy of the site as a dict, for a test to break
one thing in; ``write`` saves it as a site file.
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.caches.tools import FakeTools
from tests.peers.bmc import FakeBmc, start_fake_bmc
from tests.peers.nut import ON_LINE, NutServer, start_nut
from tests.peers.nut_driver import DRIVER_COMMANDS
from tests.peers.ports import free_port
from tests.peers.redfish import RedfishBmc
from tests.peers.snmpsim import V3_AUTH_KEY, V3_PRIV_KEY, V3_USER, SnmpSim, read_only, start_snmpsim
from tests.peers.sshd import Sshd
from tests.peers.vcsim import (
    LAB_ARGS,
    LIMITED_PASSWORD,
    LIMITED_USER,
    Tls,
    Vcsim,
    VmSpec,
    create_vm,
    grant,
    start_vcsim,
    tag_vms,
    wait_for_tools,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "examples" / "cluster.yaml"
HOSTS = {"esx01": "DC0_C0_H0", "esx02": "DC0_C0_H1", "esx03": "DC0_C0_H2"}
ESXI_PASSWORD = "esxi-Secret-1"
VMS = (
    VmSpec("dc01", "DC0_C0_H0", folder="Infra"),
    VmSpec("dc02", "DC0_C0_H1", folder="Infra"),
    VmSpec("vcsa", "DC0_C0_H0", folder="Infra"),
    VmSpec("sql01", "DC0_C0_H1", folder="Prod/Db"),
    VmSpec("app-01", "DC0_C0_H2", folder="Prod/App"),
    VmSpec("app-02", "DC0_C0_H0", folder="Prod/App"),
    VmSpec("web-01", "DC0_C0_H0", folder="Prod/Web"),
    VmSpec("web-02", "DC0_C0_H1", folder="Prod/Web"),
    VmSpec("batch-01", "DC0_C0_H2", folder="Batch", attributes={"tier": "batch"}),
    # off, and without VMware Tools: a test powers it on when it wants such a VM in the plan
    VmSpec("legacy-01", "DC0_C0_H2", folder="Legacy", tools=False, power_on=False),
)
#: The privileges of the limited user: enough for VMs, nothing for hosts or vCenter settings.
LIMITED_PRIVILEGES = [
    "System.Anonymous",
    "System.View",
    "System.Read",
    "VirtualMachine.Interact.PowerOff",
    "VirtualMachine.Interact.PowerOn",
]
FVP_VMS = {
    "a": {"vm": "sql01", "peers": 1, "ext_peers": 0},
    "b": {"vm": "app-01", "peers": 1, "ext_peers": 0},
    "c": {"vm": "app-02", "peers": 1, "ext_peers": 0},
}


@dataclass
class ClusterLab:
    root: Path
    vcsim: Vcsim
    snmp: SnmpSim
    nut: NutServer
    sshd: Sshd
    redfish: RedfishBmc
    bmcs: dict[str, FakeBmc]
    fvp: FakeTools
    files: dict[str, Path] = field(default_factory=dict)

    def secret(self, name: str, text: str) -> Path:
        path = self.root / "etc" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text + "\n")
        path.chmod(0o600)
        return path

    def site_data(self) -> dict[str, Any]:
        """The example, pointed at the peers: a fresh dict on every call."""
        data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
        data["journal"] = str(self.root / "hq.sqlite")
        ups_a, ups_b = data["ups"]
        ups_a["snmp"].update(
            host="127.0.0.1",
            port=self.snmp.port,
            user=V3_USER,
            auth_protocol="sha",  # what snmpsim's user has
            auth_key_file=str(self.secret("snmp-auth.key", V3_AUTH_KEY)),
            priv_key_file=str(self.secret("snmp-priv.key", V3_PRIV_KEY)),
            context="ups-mib",
            trap_port=free_port(socket.SOCK_DGRAM),
            timeout="2s",
            retries=1,
        )
        ups_b["nut"].update(
            host="127.0.0.1",
            port=self.nut.port,
            ups="smt3000",
            user="upsguard",
            password_file=str(
                self.secret("nut.pw", self.nut.password_file("upsguard").read_text().strip())
            ),
            ca_file=str(self.nut.ca_file),
        )
        vc = data["platforms"]["vcenter"]
        vc.update(
            host=self.vcsim.host,
            port=self.vcsim.port,
            user=self.vcsim.user,
            ca_file=str(self.vcsim.tls.ca_file),
        )
        vc.pop("password_env")
        vc["password_file"] = str(self.secret("vcenter.pw", self.vcsim.password))
        vc["direct_hosts"]["password_file"] = str(self.secret("esxi.pw", ESXI_PASSWORD))
        vc["direct_hosts"]["ca_file"] = str(self.vcsim.tls.ca_file)
        # vCenter's own VM is read through its ESXi host, as a real step does: the same
        # simulator plays the host, with the host's root login (-user)
        where = f"{self.vcsim.host}:{self.vcsim.port}"
        vc["direct_addresses"] = {host: where for host in HOSTS.values()}
        redfish_pw = self.secret("redfish.pw", self.redfish.password_file.read_text().strip())
        for name in ("bmc-esx01", "bmc-esx02"):
            data["platforms"][name] = self.redfish.settings_dict(
                system_id="srv-on", password_file=str(redfish_pw)
            )
        for name in ("bmc-esx03", "bmc-nas01"):
            bmc = self.bmcs[name]
            pw = self.secret(f"{name}.pw", bmc.password_file.read_text().strip())
            data["platforms"][name] = bmc.settings_dict(password_file=str(pw))
        ssh = {k: v for k, v in self.sshd.settings_dict().items() if k != "host"}
        data["platforms"]["storage-ssh"] = {"type": "ssh", **ssh}
        cache = data["caches"][0]
        cache.update(
            pwsh_command=self.fvp.path("pwsh"),
            user="upsguard",
            password_file=str(self.secret("fvp.pw", "fvp-Secret-1")),
            state_dir=str(self.root / "caches"),
        )
        for res in data["resources"]:
            if res["id"] in HOSTS:
                res["host"] = HOSTS[res["id"]]
            if res["id"] == "nas01":
                res["host"] = "127.0.0.1"
            if res["id"] == "mgmt01":
                res["platform"] = "storage-ssh"
        return copy.deepcopy(data)

    def write(self, data: dict[str, Any], name: str = "site.yaml") -> Path:
        path = self.root / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def stop(self) -> None:
        for peer in (self.vcsim, self.snmp, self.nut, *self.bmcs.values()):
            peer.stop()


def start_cluster_lab(root: Path, tls: Tls, sshd: Sshd, redfish: RedfishBmc) -> ClusterLab:
    started: list[Any] = []
    try:
        users = ("-user", f"{LIMITED_USER}:{LIMITED_PASSWORD}", "-user", f"root:{ESXI_PASSWORD}")
        sim = start_vcsim(tls, *LAB_ARGS, *users)
        started.append(sim)
        for spec in VMS:
            create_vm(sim, spec)
        tag_vms(sim, "tier", "app", ["app-01", "app-02"])
        grant(sim, LIMITED_USER, "upsguard-vms-only", LIMITED_PRIVILEGES)
        wait_for_tools(sim)
        snmp = start_snmpsim(root / "snmpsim", {"ups-mib-ro": read_only("ups-mib")})
        started.append(snmp)
        nut = start_nut(
            root / "nut",
            {"smt3000": ON_LINE, "dummy": ON_LINE},
            ext="dev",
            tls=True,
            fake_drivers={"smt3000": DRIVER_COMMANDS},
        )
        started.append(nut)
        bmcs = {}
        for name in ("bmc-esx03", "bmc-nas01"):
            bmcs[name] = start_fake_bmc(root / name, power="on")
            started.append(bmcs[name])
        fvp = FakeTools(root / "fvp", {k: _fvp_vm(**v) for k, v in FVP_VMS.items()})
        data = fvp.read()
        data["password"] = "fvp-Secret-1"
        fvp.write(data)
        return ClusterLab(root, sim, snmp, nut, sshd, redfish, bmcs, fvp)
    except BaseException:
        for peer in started:
            peer.stop()
        raise


def _fvp_vm(vm: str, peers: int, ext_peers: int) -> dict[str, object]:
    return {
        "kind": "fvp", "vm": vm, "policy": "WriteBack", "peers": peers, "ext_peers": ext_peers,
        "dirty": 0, "rate": 1000.0, "draining": False, "accepting": True,
    }  # fmt: skip


@pytest.fixture(scope="module")
def cluster_lab(
    tmp_path_factory: pytest.TempPathFactory, vcsim_tls: Tls, sshd: Sshd, redfish_bmc: RedfishBmc
) -> Iterator[ClusterLab]:
    lab = start_cluster_lab(tmp_path_factory.mktemp("cluster"), vcsim_tls, sshd, redfish_bmc)
    yield lab
    lab.stop()
