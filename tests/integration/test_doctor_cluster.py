"""``upsguard doctor`` on the cluster example against the real peers (``tests.peers.cluster``):
every row ok and exit 0; then one fault at a time, each a ``fail`` row naming it, one line
on stderr, and exit 1. The faults are those of a real site: an upsd user without instcmd
rights, a driver without the command, a VM whose VMware Tools do not run, a vCenter user
without a privilege, an SNMP agent that lets us read but not write, an SSH host key nobody
vouched for, a BMC that is down, a secret file that is missing, a webhook that fails.

vCenter's authorization: upsguard-vcsim (tests/vcsim_ext) answers ``HasPrivilegeOnEntities``
from the roles and permissions set through the API; the lab logs in a second user,
``limited@vsphere.local`` (``-user``), with a role ``upsguard-vms-only`` holding
System.Anonymous, System.View, System.Read, VirtualMachine.Interact.PowerOff and .PowerOn,
set on the root folder, propagated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyVmomi import vim

from tests.peers.bmc import FakeBmc
from tests.peers.cluster import ClusterLab
from tests.peers.vcsim import LIMITED_PASSWORD, LIMITED_USER, wait_task
from tests.peers.webhook import WebhookServer
from upsguard.config import load_site
from upsguard.config.files import named_files

pytestmark = [
    pytest.mark.vcsim,
    pytest.mark.nut,
    pytest.mark.snmp,
    pytest.mark.sshd,
    pytest.mark.timeout(300),
]

Site = dict[str, Any]


def upsguard(
    lab: ClusterLab, command: str, data: Site, *args: str
) -> subprocess.CompletedProcess[str]:
    """``upsguard COMMAND -c SITE ARGS`` as a person runs it, on the site ``data``."""
    site = lab.write(data, f"{command}.yaml")
    return subprocess.run(
        [sys.executable, "-m", "upsguard", command, "-c", str(site), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def doctor(lab: ClusterLab, data: Site, *args: str) -> subprocess.CompletedProcess[str]:
    return upsguard(lab, "doctor", data, *args)


def drill(lab: ClusterLab, data: Site, *args: str) -> subprocess.CompletedProcess[str]:
    return upsguard(lab, "drill", data, *args)


def rows(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(done.stdout)["findings"]
    return found


def named(data: Site, section: str, name: str) -> dict[str, Any]:
    entries = data[section] if isinstance(data[section], list) else list(data[section].values())
    return next(e for e in entries if e.get("name", e.get("id")) == name)


def test_the_cluster_example_is_ready_for_an_outage(cluster_lab: ClusterLab) -> None:
    done = doctor(cluster_lab, cluster_lab.site_data())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["STATE", "WHAT", "CHECK", "TOOK", "FOUND"]
    assert lines[-1].startswith("doctor: ") and " 0 warn, 0 fail in " in lines[-1]
    table = [line.split(maxsplit=4) for line in lines[1:-2]]
    assert {row[0] for row in table} == {"ok"}
    checked = {(row[1], row[2], row[3]) for row in table}
    example = cluster_lab.site_data()
    for ups in ("ups-a", "ups-b"):
        for check in ("login", "data", "commands", "rights"):
            assert ("ups", ups, check) in checked
    assert ("ups", "ups-b", "starttls") in checked
    assert {("platform", "vcenter", "login"), ("platform", "vcenter", "privileges")} <= checked
    for bmc in ("bmc-esx01", "bmc-esx02", "bmc-esx03", "bmc-nas01"):
        assert ("platform", bmc, "answers") in checked
    for res in example["resources"]:
        if res.get("platform"):  # the switches have none: they go down with the UPS
            assert ("resource", res["id"], "state") in checked
    for vm in ("dc01", "dc02", "sql01", "app", "web", "batch", "vcenter"):
        assert ("resource", vm, "graceful") in checked
    assert {("resource", "nas01", "ssh"), ("resource", "mgmt01", "ssh")} <= checked
    assert {("cache", "esx-flash", "read"), ("cache", "esx-flash", "rights")} <= checked
    assert ("plan", "shutdown", "plan") in checked
    assert ("plan", "app", "placement") in checked
    files = {row[2] for row in table if row[1] == "file"}
    site = load_site(cluster_lab.write(example))
    assert files == {str(f.path) for f in named_files(site)} | {str(site.journal)}


@pytest.fixture
def legacy_vm_on(cluster_lab: ClusterLab) -> Iterator[None]:
    """legacy-01, a VM without VMware Tools, running for the length of one test."""
    vm = cluster_lab.vcsim.vm("legacy-01")
    wait_task(vm.PowerOnVM_Task())
    yield
    wait_task(vm.PowerOffVM_Task())


@pytest.fixture
def dead_bmc(fake_bmc_factory: Callable[..., FakeBmc]) -> FakeBmc:
    """A fake BMC that answered once and is down now (its process stopped)."""
    bmc = fake_bmc_factory(power="on", name="dead")
    bmc.stop()
    return bmc


def _nut_user_without_instcmds(lab: ClusterLab, data: Site) -> None:
    nut = named(data, "ups", "ups-b")["nut"]
    nut.update(user="mon", password_file=str(lab.secret("mon.pw", "mon-secret")))


def _driver_without_the_command(lab: ClusterLab, data: Site) -> None:
    named(data, "ups", "ups-b")["nut"]["ups"] = "dummy"


def _vm_without_tools(lab: ClusterLab, data: Site) -> None:
    legacy = {"id": "legacy", "kind": "vm", "platform": "vcenter", "vm": "legacy-01"}
    data["resources"].insert(0, {**legacy, "runs_on": ["esx03"], "depends_on": ["dc01"]})


def _vcenter_user_without_privileges(lab: ClusterLab, data: Site) -> None:
    vc = data["platforms"]["vcenter"]
    vc.update(user=LIMITED_USER, password_file=str(lab.secret("limited.pw", LIMITED_PASSWORD)))


def _snmp_agent_read_only(lab: ClusterLab, data: Site) -> None:
    named(data, "ups", "ups-a")["snmp"]["context"] = "ups-mib-ro"


def _ssh_host_key_unknown(lab: ClusterLab, data: Site) -> None:
    data["platforms"]["storage-ssh"]["known_hosts"] = str(lab.sshd.empty_known_hosts)


def _secret_file_missing(lab: ClusterLab, data: Site) -> None:
    data["platforms"]["bmc-nas01"]["password_file"] = str(lab.root / "etc" / "gone.pw")


FAULTS = {
    "upsd user without instcmd rights": (
        _nut_user_without_instcmds,
        ("ups", "ups-b", "rights"),
        "FAIL ups ups-b: rights: upsd refused user 'mon': instant command test.battery.stop: "
        "ACCESS-DENIED",
    ),
    "driver without the command": (
        _driver_without_the_command,
        ("ups", "ups-b", "commands"),
        "FAIL ups ups-b: commands: the driver of 'dummy' lacks shutdown.return (it offers: "
        "load.off)",
    ),
    "vCenter user without a privilege": (
        _vcenter_user_without_privileges,
        ("platform", "vcenter", "privileges"),
        f"FAIL platform vcenter: privileges: {LIMITED_USER} lacks Global.ManageCustomFields "
        "(the attribute that records HA and DRS values) on vCenter; Global.SetCustomField (HA "
        "and DRS values recorded on the cluster) on DC0_C0; Global.Settings (vCLS retreat "
        "mode) on vCenter; Host.Config.Maintenance (maintenance mode and host shutdown) on "
        "DC0_C0_H0, DC0_C0_H1, DC0_C0_H2; Host.Inventory.EditCluster (HA and DRS set aside for "
        "the shutdown) on DC0_C0",
    ),
    "SNMP agent read-only": (
        _snmp_agent_read_only,
        ("ups", "ups-a", "rights"),
        "FAIL ups ups-a: rights: the agent refused to write upsAutoRestart back with its own "
        "value 1",
    ),
    "SSH host key unknown": (
        _ssh_host_key_unknown,
        ("resource", "nas01", "ssh"),
        "FAIL resource nas01: ssh: ",
    ),
    "secret file missing": (
        _secret_file_missing,
        ("platform", "bmc-nas01", "login"),
        "gone.pw: cannot read the file: No such file or directory",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_a_fail_row_and_exit_1(cluster_lab: ClusterLab, fault: str) -> None:
    breaks, key, line = FAULTS[fault]
    data = cluster_lab.site_data()
    breaks(cluster_lab, data)
    done = doctor(cluster_lab, data, "--format", "json")
    assert done.returncode == 1, done.stderr
    failed = [r for r in rows(done) if r["verdict"] == "fail"]
    keys = {(r["area"], r["subject"], r["check"]) for r in failed}
    assert key in keys, failed
    assert any(line in err for err in done.stderr.splitlines()), done.stderr
    assert all(err.startswith("upsguard: FAIL ") for err in done.stderr.splitlines())


def test_an_unknown_host_key_is_named_with_its_fix(cluster_lab: ClusterLab) -> None:
    data = cluster_lab.site_data()
    _ssh_host_key_unknown(cluster_lab, data)
    done = doctor(cluster_lab, data, "--format", "json", "--only", "nas01")
    (row,) = [r for r in rows(done) if r["verdict"] == "fail"]
    assert "host is not in" in row["detail"] and "refusing to connect" in row["detail"]
    assert row["fix"].startswith("verify the host's key, then add it to known_hosts (ssh-keyscan")
    assert done.returncode == 1


def test_a_missing_secret_file_is_its_own_row(cluster_lab: ClusterLab) -> None:
    data = cluster_lab.site_data()
    _secret_file_missing(cluster_lab, data)
    done = doctor(cluster_lab, data, "--format", "json", "--only", "file", "bmc-nas01")
    gone = str(cluster_lab.root / "etc" / "gone.pw")
    failed = {
        (r["area"], r["subject"], r["check"]): r for r in rows(done) if r["verdict"] == "fail"
    }
    assert set(failed) == {("file", gone, "readable"), ("platform", "bmc-nas01", "login")}
    assert failed[("file", gone, "readable")]["detail"] == (
        f"platforms.bmc-nas01.password_file: {gone} does not exist"
    )
    assert done.returncode == 1


def test_a_vm_without_tools_says_it_will_be_powered_off_hard(
    cluster_lab: ClusterLab, legacy_vm_on: None
) -> None:
    data = cluster_lab.site_data()
    _vm_without_tools(cluster_lab, data)
    done = doctor(cluster_lab, data, "--format", "json", "--only", "legacy")
    (row,) = [r for r in rows(done) if r["check"] == "graceful"]
    assert row["verdict"] == "fail"
    assert row["detail"] == (
        "no guest shutdown possible in legacy-01 (no VMware Tools running): powered off hard "
        "at once, adding nothing to the plan but losing what the guest had not written"
    )
    assert row["adds_s"] == 0.0
    assert done.returncode == 1
    assert "FAIL resource legacy: graceful: no guest shutdown possible in legacy-01" in done.stderr


def test_a_bmc_that_is_down(cluster_lab: ClusterLab, dead_bmc: FakeBmc) -> None:
    data = cluster_lab.site_data()
    data["platforms"]["bmc-esx03"] = dead_bmc.settings_dict(
        password_file=str(cluster_lab.secret("dead.pw", "s3cret-bmc"))
    )
    done = doctor(cluster_lab, data, "--only", "bmc-esx03")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"upsguard: FAIL platform bmc-esx03: login: BMC 'bmc-esx03' (127.0.0.1:{dead_bmc.port}): "
        "log in failed: no answer (is IPMI over LAN enabled, and the address right?)"
    )


def test_notify_sends_a_test_message(
    cluster_lab: ClusterLab, webhook_server: WebhookServer
) -> None:
    data = cluster_lab.site_data()
    data["service"] = {"notify": {"webhook": {"url": webhook_server.url}}}
    done = doctor(cluster_lab, data, "--format", "json", "--only", "notify", "--notify")
    assert done.returncode == 0, done.stderr
    (row,) = rows(done)
    origin = webhook_server.url.removesuffix("/hooks/ups")
    assert (row["subject"], row["check"], row["verdict"]) == (f"webhook {origin}", "send", "ok")
    (body,) = webhook_server.received
    assert body["event"] == "Test" and body["site"] == "hq"


def test_a_webhook_that_fails(cluster_lab: ClusterLab, webhook_server: WebhookServer) -> None:
    webhook_server.status = 500
    data = cluster_lab.site_data()
    data["service"] = {"notify": {"webhook": {"url": webhook_server.url}}}
    done = doctor(cluster_lab, data, "--only", "notify", "--notify")
    assert done.returncode == 1
    origin = webhook_server.url.removesuffix("/hooks/ups")
    assert done.stderr.splitlines() == [
        f"upsguard: FAIL notify webhook {origin}: send: webhook {origin}: HTTP 500 -> check the "
        "URL, the token file and the server (a 3xx: give the final URL)"
    ]
    assert "/hooks/ups" not in done.stdout + done.stderr  # a webhook's path is a secret


def test_without_notify_nothing_is_sent(
    cluster_lab: ClusterLab, webhook_server: WebhookServer
) -> None:
    data = cluster_lab.site_data()
    data["service"] = {"notify": {"webhook": {"url": webhook_server.url}}}
    done = doctor(cluster_lab, data, "--only", "notify")
    assert done.returncode == 0
    assert webhook_server.received == []


def vm_power(lab: ClusterLab) -> dict[str, str]:
    return {vm.name: str(vm.runtime.powerState) for vm in lab.vcsim.all(vim.VirtualMachine)}


def test_drill_rehearses_the_shutdown_and_changes_nothing(cluster_lab: ClusterLab) -> None:
    before = vm_power(cluster_lab)
    commands = cluster_lab.nut.commands_received("smt3000")
    data = cluster_lab.site_data()
    done = drill(cluster_lab, data, "--format", "json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["live_inventory"] is True
    steps = {s["step"]: s for s in answer["steps"]}
    assert {s["would"] for s in steps.values()} == {"act"}
    assert steps["stop:sql01"]["detail"] == "shut down the guest of sql01"
    assert steps["stop:sql01"]["states"] == ["on"]
    assert steps["stop:esx02"]["detail"] == (
        "shut down host DC0_C0_H1; after the destage of esx-flash (0 B dirty now)"
    )
    assert steps["stop:nas01"]["detail"].startswith("run '/sbin/shutdown -h now' on 127.0.0.1")
    assert steps["stop:mgmt01"]["detail"] == (
        "run 'systemctl poweroff' on 127.0.0.1, the machine running upsguard, last"
    )
    ids = list(steps)
    assert ids.index("stop:sql01") < ids.index("stop:esx02") < ids.index("stop:nas01")
    assert ids[-1] == "stop:mgmt01"
    # nothing was stopped, told or journaled
    assert vm_power(cluster_lab) == before
    assert cluster_lab.nut.commands_received("smt3000") == commands
    assert all(bmc.actions() == [] for bmc in cluster_lab.bmcs.values())
    assert not (cluster_lab.root / "hq.sqlite").exists()


def test_drill_says_which_step_would_fail(cluster_lab: ClusterLab) -> None:
    data = cluster_lab.site_data()
    _ssh_host_key_unknown(cluster_lab, data)
    done = drill(cluster_lab, data)
    assert done.returncode == 1
    failing = [line for line in done.stderr.splitlines() if "would fail" in line]
    assert [line.split(" would fail: ")[0] for line in failing] == [
        "upsguard: stop:nas01",
        "upsguard: stop:mgmt01",
    ]
    assert "root@127.0.0.1:" in failing[0] and "host is not in" in failing[0]
    table = done.stdout.splitlines()
    (nas,) = [line for line in table if line.startswith("stop:nas01 ")]
    assert nas.split()[1:3] == ["fail", "on"]
