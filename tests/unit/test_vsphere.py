"""The vsphere platform's pure parts: selectors, system VMs, states, fault lines, settings,
and the lean reads' HTTP framing (over a local socket pair)."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from pyVmomi import vim

from upsguard.clock import SystemClock
from upsguard.config.platforms import VsphereSettings
from upsguard.config.resources import Selector
from upsguard.errors import ConfigError
from upsguard.models import PlatformName, PowerState
from upsguard.plugins.platforms.vsphere import VspherePlatform
from upsguard.plugins.platforms.vsphere.connection import Endpoint, fault_text
from upsguard.plugins.platforms.vsphere.inventory import Snapshot, VmInfo, is_system_vm
from upsguard.plugins.platforms.vsphere.reads import _read_chunked, _value
from upsguard.plugins.platforms.vsphere.states import host_power, vm_power


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
    gone = {"runtime.powerState": "unknown", "runtime.connectionState": "notResponding"}
    assert host_power(gone) is PowerState.OFF  # what vCenter shows of a host shut down
    assert host_power({"runtime.powerState": "standBy"}) is PowerState.STANDBY


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


# --- the lean SOAP reads: HTTP framing and values ----------------------------------------


def _served(payload: bytes) -> tuple[Any, Any]:
    """A connected socket pair whose far end has sent ``payload`` in small pieces."""
    near, far = socket.socketpair()
    for i in range(0, len(payload), 7):  # pieces that split sizes, data and line ends
        far.sendall(payload[i : i + 7])
    return near, far


def test_a_chunked_answer_is_put_together_across_reads() -> None:
    """RFC 9112 7.1: hex sizes (with an extension), chunks, a last empty chunk, trailers."""
    body = b"4;ext=1\r\nWiki\r\n7\r\npedia i\r\nB\r\nn \r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n"
    near, far = _served(body)
    with near, far:
        assert _read_chunked(near, b"") == b"Wikipedia in \r\nchunks."


def test_a_chunked_answer_without_trailers_ends_at_the_empty_line() -> None:
    near, far = _served(b"3\r\nabc\r\n0\r\n\r\n")
    with near, far:
        assert _read_chunked(near, b"") == b"abc"


def test_an_answer_cut_short_is_an_error_not_a_short_value() -> None:
    near, far = _served(b"10\r\nshort")
    far.close()
    with near, pytest.raises(ConnectionError):
        _read_chunked(near, b"")


def test_property_values_keep_their_types() -> None:
    """The shapes vCenter sends (seen from vcsim): xsi:type on each val, enums as text."""
    xsi = "{http://www.w3.org/2001/XMLSchema-instance}type"
    assert _value(ET.Element("val", {xsi: "xsd:boolean"})) is False
    flag = ET.Element("val", {xsi: "xsd:boolean"})
    flag.text = "true"
    assert _value(flag) is True
    count = ET.Element("val", {xsi: "xsd:int"})
    count.text = "42"
    assert _value(count) == 42
    power = ET.Element("val", {xsi: "VirtualMachinePowerState"})
    power.text = "poweredOn"
    assert vm_power({"runtime.powerState": _value(power)}) is PowerState.ON
