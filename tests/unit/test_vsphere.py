"""The vsphere platform's pure parts: selectors, system VMs, states, settings, the map
from pyVmomi's faults to upsguard's errors, and the lean reads' property values."""

from __future__ import annotations

import http.client
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pyVmomi import vim

from upsguard.clock import SystemClock
from upsguard.config.platforms import VsphereSettings
from upsguard.config.resources import Selector
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    GracefulUnavailable,
    PermanentError,
    PlatformUnreachable,
    UpsguardError,
)
from upsguard.models import PlatformName, PowerState
from upsguard.plugins.platforms.base import AcceptedShutdowns
from upsguard.plugins.platforms.vsphere import VspherePlatform
from upsguard.plugins.platforms.vsphere.endpoint import Endpoint
from upsguard.plugins.platforms.vsphere.faults import fault_text, vsphere_faults
from upsguard.plugins.platforms.vsphere.inventory import Snapshot, VmInfo, is_system_vm
from upsguard.plugins.platforms.vsphere.lean import value
from upsguard.plugins.platforms.vsphere.states import host_lost, host_power, vm_power


def vm(name: str, folder: str = "", **attributes: str) -> VmInfo:
    return VmInfo(
        ref=f"vm-{name}",
        name=name,
        power="poweredOn",
        host_ref="host-1",
        tools="guestToolsRunning",
        folder=folder,
        attributes=attributes,
    )


SNAP = Snapshot(
    vms={
        v.ref: v
        for v in (
            vm("web-01", "Prod/Web", tier="web"),
            vm("web-02", "Prod/Web/Edge", tier="web"),
            vm("webby", "Production", tier="web"),
            vm("sql01", "Prod/Db", tier="db"),
        )
    },
    hosts={},
    clusters=[],
    datacenters=[],
    round_trips=0,
)


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        (Selector(name="web-*"), ["web-01", "web-02"]),
        (Selector(folder="Prod/Web"), ["web-01", "web-02"]),  # sub-folders too
        (Selector(folder="/Prod/"), ["sql01", "web-01", "web-02"]),  # not "Production"
        (Selector(attribute={"tier": "web"}, folder="Prod"), ["web-01", "web-02"]),
        (Selector(name="WEB-*"), []),  # names match case-sensitively, as vSphere's do
    ],
)
def test_selectors(selector: Selector, names: list[str]) -> None:
    assert [v.name for v in SNAP.select(selector)] == names


def test_tag_selector_uses_the_tagged_ids() -> None:
    chosen = SNAP.select(Selector(tag="tier:db", folder="Prod"), tagged={"vm-sql01", "vm-webby"})
    assert [v.name for v in chosen] == ["sql01"]


@pytest.mark.parametrize(
    ("name", "folder", "managed_by", "system"),
    [
        ("vCLS-4c1a2b3d-1", "", None, True),
        ("vCLS (1)", "", None, True),
        ("agent", "vCLS", None, True),
        ("nsx-agent", "", "com.vmware.vim.eam", True),
        ("vCLSsomething", "Prod", None, False),
        ("web-01", "Prod/Web", "com.example.backup", False),
    ],
)
def test_system_vms(name: str, folder: str, managed_by: str | None, system: bool) -> None:
    assert is_system_vm(name, folder, managed_by) is system


def test_power_states() -> None:
    assert vm_power({"runtime.powerState": "suspended"}) is PowerState.OFF
    assert vm_power({}) is PowerState.UNKNOWN
    on = {"runtime.powerState": "poweredOn", "runtime.connectionState": "connected"}
    assert host_power(on) is PowerState.ON
    assert host_power({"runtime.powerState": "standBy"}) is PowerState.STANDBY
    assert host_power({"runtime.powerState": "poweredOff"}) is PowerState.OFF


def test_a_host_vcenter_lost_is_off_only_once_it_accepted_its_shutdown() -> None:
    """vCenter shows a host it lost as notResponding (its power state unknown): a host shut
    down, and one behind a broken management network, alike. Before its shutdown was
    accepted that is unknown (the step asks, and vCenter's answer says why it cannot); after,
    it is the shutdown landing."""
    gone = {"runtime.powerState": "unknown", "runtime.connectionState": "notResponding"}
    up = {"runtime.powerState": "poweredOn", "runtime.connectionState": "connected"}
    seen = AcceptedShutdowns()
    reads = [gone, up, gone, up, gone]
    before = [seen.state("esx01", host_power(p), quiet=host_lost(p)) for p in reads[:1]]
    seen.asked("esx01")  # ShutdownHost_Task accepted: the host still reads up a moment
    after = [seen.state("esx01", host_power(p), quiet=host_lost(p)) for p in reads[1:]]
    assert before == [PowerState.UNKNOWN]
    # up, then lost (the shutdown landing), then up again (it came back): lost is unknown
    assert after == [PowerState.ON, PowerState.OFF, PowerState.ON, PowerState.UNKNOWN]


def test_fault_text_is_one_line_with_the_fault_name() -> None:
    fault = vim.fault.InvalidState(msg="host esx01 is not in\n maintenance mode")
    assert fault_text(fault) == "host esx01 is not in maintenance mode (InvalidState)"
    assert fault_text(vim.fault.ToolsUnavailable()) == "ToolsUnavailable"


def test_unreadable_ca_file_is_a_config_error(tmp_path: Path) -> None:
    endpoint = Endpoint("vc", "h", 443, "u", lambda: "", True, tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="cannot read ca_file"):
        endpoint.ssl_context()


def test_a_password_source_is_required() -> None:
    conf = VsphereSettings.model_validate({"type": "vsphere", "host": "vc", "user": "u"})
    with pytest.raises(ConfigError, match="give password_file or password_env"):
        VspherePlatform(PlatformName("vc"), conf, SystemClock())


def test_inline_password_is_refused() -> None:
    with pytest.raises(ValueError, match="inline 'password' is not accepted"):
        VsphereSettings.model_validate(
            {"type": "vsphere", "host": "vc", "user": "u", "password": "x"}
        )


# --- pyVmomi's faults as upsguard's errors ---------------------------------------------

ENDPOINT = Endpoint("vsphere platform 'vc'", "vc.lab", 443, "ops@vsphere.local", lambda: "pw")


@pytest.mark.parametrize(
    ("raised", "error", "line"),
    [
        (
            vim.fault.InvalidLogin(msg="Login failure"),
            AuthenticationError,
            "vsphere platform 'vc': vc.lab:443 refused the login of user 'ops@vsphere.local': "
            "check the user and its password file or variable",
        ),
        (
            vim.fault.NotAuthenticated(),
            AuthenticationError,
            "vsphere platform 'vc': power off web-01: session lost",
        ),
        (vim.fault.ToolsUnavailable(), GracefulUnavailable, "VMware Tools are not running"),
        (
            vim.fault.InvalidState(msg="the host is\n in maintenance mode"),
            PermanentError,
            "vsphere platform 'vc': power off web-01: "
            "the host is in maintenance mode (InvalidState)",
        ),
        (
            ConnectionResetError(104, "Connection reset by peer"),
            PlatformUnreachable,
            "vsphere platform 'vc': power off web-01: vc.lab:443 did not answer: "
            "connection reset by peer",
        ),
        (
            http.client.RemoteDisconnected("Remote end closed connection without response"),
            PlatformUnreachable,
            "vsphere platform 'vc': power off web-01: vc.lab:443 did not answer: "
            "Remote end closed connection without response",
        ),
    ],
)
def test_faults_become_the_most_specific_error_on_one_line(
    raised: Exception, error: type[UpsguardError], line: str
) -> None:
    with pytest.raises(error) as caught, vsphere_faults(ENDPOINT, "power off web-01"):
        raise raised
    assert type(caught.value) is error
    assert str(caught.value) == line
    assert caught.value.__cause__ is raised


def test_a_login_that_finds_nobody_names_the_address() -> None:
    with pytest.raises(PlatformUnreachable) as caught, vsphere_faults(ENDPOINT):
        raise ConnectionRefusedError(111, "Connection refused")
    assert str(caught.value) == "vsphere platform 'vc': cannot reach vc.lab:443: connection refused"


def test_errors_of_upsguard_and_unknown_ones_pass_unchanged() -> None:
    config = ConfigError("vsphere platform 'vc': cannot read ca_file x")
    with pytest.raises(ConfigError) as caught, vsphere_faults(ENDPOINT, "read the inventory"):
        raise config
    assert caught.value is config
    with pytest.raises(KeyError), vsphere_faults(ENDPOINT, "read the inventory"):
        raise KeyError("runtime.powerState")


def test_property_values_keep_their_types() -> None:
    """The shapes vCenter sends (seen from vcsim): xsi:type on each val, enums as text."""
    xsi = "{http://www.w3.org/2001/XMLSchema-instance}type"
    assert value(ET.Element("val", {xsi: "xsd:boolean"})) is False
    flag = ET.Element("val", {xsi: "xsd:boolean"})
    flag.text = "true"
    assert value(flag) is True
    count = ET.Element("val", {xsi: "xsd:int"})
    count.text = "42"
    assert value(count) == 42
    power = ET.Element("val", {xsi: "VirtualMachinePowerState"})
    power.text = "poweredOn"
    assert vm_power({"runtime.powerState": value(power)}) is PowerState.ON
