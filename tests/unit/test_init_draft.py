"""The site file ``upsguard init`` drafts (``config.draft``), from plain inventory data, and the
addresses its options take. Against vCenter and upsd themselves: tests/integration/test_init.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from upsguard.cli import main
from upsguard.cli.init import nut_address, vcenter_address
from upsguard.config.draft import PLATFORM, FoundHost, FoundNut, FoundVcenter, FoundVm, draft_site
from upsguard.config.loading import check_site
from upsguard.config.policies import PoliciesConfig
from upsguard.config.site import SiteConfig
from upsguard.config.source import parse_yaml
from upsguard.models import ResourceKind
from upsguard.plugins import catalog
from upsguard.plugins.platforms.vsphere.own_vm import is_the_guest_of
from upsguard.runbooks.planner import Planner

NUT = FoundNut("127.0.0.1", 3493, {"ups-a": "Eaton 5P1550", "ups-b": ""})


def vcenter(vms: list[FoundVm], manager: str | None = None, **extra: object) -> FoundVcenter:
    return FoundVcenter(
        host="vcsa.lab.example",
        port=443,
        user="upsguard@vsphere.local",
        password_file=Path("/etc/upsguard/vc.pw"),
        hosts=[FoundHost("esx01", "C0"), FoundHost("esx02", "C0")],
        vms=vms,
        manager_vm=manager,
        **extra,  # type: ignore[arg-type]
    )


LAB_VMS = [
    FoundVm("dc01", "esx01"),
    FoundVm("sql01", "esx02"),
    FoundVm("vcsa", "esx01"),
    FoundVm("vCLS-1a2b", "esx01", system=True),
    FoundVm("old", "esx02", power="poweredOff"),
    FoundVm("orphan", None),
]


def drafted(found: FoundVcenter, nut: FoundNut = NUT) -> tuple[str, SiteConfig]:
    text = draft_site(found, nut)
    return text, check_site(parse_yaml(text, "drafted.yaml"), catalog.names)


def test_the_draft_validates_and_places_each_vm_on_its_host() -> None:
    _, site = drafted(vcenter(LAB_VMS, manager="vcsa"))
    vms = {str(r.id): r for r in site.resources if r.kind is ResourceKind.VM}
    assert sorted(vms) == ["dc01", "old", "orphan", "sql01", "vcsa"]
    assert vms["sql01"].runs_on == ["esx02"] and vms["orphan"].runs_on == []
    assert all(r.depends_on == [] for r in vms.values())
    assert vms["vcsa"].serves_platform == PLATFORM
    assert vms["old"].start is False and vms["dc01"].start is None
    hosts = [r.id for r in site.resources if r.kind is ResourceKind.HOST]
    assert hosts == ["esx01", "esx02"]
    assert [(f.ups, f.powers) for f in site.feeds] == [
        (["ups-a"], ["esx01", "esx02"]),
        (["ups-b"], ["esx01", "esx02"]),
    ]


def test_the_draft_plans_each_host_after_its_vms_and_vcenter_last() -> None:
    _, site = drafted(vcenter(LAB_VMS, manager="vcsa"))
    steps = [str(s.id) for s in Planner(site).plan("shutdown").steps]
    assert steps.index("stop:sql01") < steps.index("stop:esx02")
    assert steps.index("stop:esx02") < steps.index("stop:vcsa")
    assert not any("vCLS" in s for s in steps)


def test_vcls_vms_are_left_out_and_named_in_a_comment() -> None:
    text, site = drafted(vcenter(LAB_VMS))
    assert all("vCLS" not in r.id for r in site.resources)
    (line,) = [line for line in text.splitlines() if "system_vms" in line]
    assert "retreat" in line and "vCLS-1a2b" in line


def test_each_thing_only_a_person_knows_is_a_todo() -> None:
    text, _ = drafted(vcenter(LAB_VMS, manager="vcsa"))
    comments = " ".join(line.strip() for line in text.splitlines() if line.strip().startswith("#"))
    todos = comments.split("# TODO:")[1:]
    for what in (
        "depends_on between VMs",
        "storage",
        "switches",
        "runs_upsguard",
        "caches",
        "power_on_via",
        "direct_hosts",
        "monitor: secondary",
        "min_supplies",
    ):
        assert any(what in todo for todo in todos), what


def test_no_direct_hosts_todo_when_vcenters_vm_is_not_known() -> None:
    text, site = drafted(vcenter(LAB_VMS))
    assert "direct_hosts" not in text
    assert all(r.serves_platform is None for r in site.resources)


def test_names_met_twice_get_ids_of_their_own() -> None:
    vms = [FoundVm("app", "esx01"), FoundVm("app", "esx02"), FoundVm("esx01", "esx02")]
    text, site = drafted(vcenter(vms))
    by_id = {str(r.id): r for r in site.resources}
    assert by_id["app"].vm is None and by_id["app-2"].vm == "app"
    assert by_id["esx01"].kind is ResourceKind.HOST
    assert by_id["esx01-2"].vm == "esx01" and by_id["esx01-2"].kind is ResourceKind.VM
    assert "TODO: 2 VMs are named app" in text


def test_tls_as_given() -> None:
    _, site = drafted(vcenter(LAB_VMS, ca_file=Path("/etc/upsguard/vc-ca.pem")))
    settings = site.platforms[PLATFORM]
    assert getattr(settings, "ca_file", None) == Path("/etc/upsguard/vc-ca.pem")
    text, site = drafted(vcenter(LAB_VMS, verify_tls=False))
    assert getattr(site.platforms[PLATFORM], "verify_tls", None) is False
    assert "TODO: its certificate was not checked" in text


def test_the_policies_written_are_the_defaults() -> None:
    _, site = drafted(vcenter(LAB_VMS))
    assert site.policies == PoliciesConfig()


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("https://vcsa.lab/sdk", ("vcsa.lab", 443)),
        ("vcsa.lab:8443", ("vcsa.lab", 8443)),
        ("https://[::1]:9443", ("::1", 9443)),
    ],
)
def test_vcenter_addresses(text: str, address: tuple[str, int]) -> None:
    assert vcenter_address(text) == address


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("nut.lab", ("nut.lab", 3493)),
        ("10.0.0.6:3494", ("10.0.0.6", 3494)),
        ("[::1]:3495", ("::1", 3495)),
        ("::1", ("::1", 3493)),
    ],
)
def test_nut_addresses(text: str, address: tuple[str, int]) -> None:
    assert nut_address(text) == address


@pytest.mark.parametrize(
    "args",
    [
        ["--vcenter", "http://vcsa.lab", "--nut", "nut.lab"],
        ["--vcenter", "https://user@vcsa.lab", "--nut", "nut.lab"],
        ["--vcenter", "vcsa.lab", "--nut", "nut.lab:0"],
        ["--vcenter", "vcsa.lab", "--nut", "nut.lab:ups"],
        ["--vcenter", "vcsa.lab"],
    ],
)
def test_bad_arguments_exit_2(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["init", "--user", "u", "--password-file", str(tmp_path / "pw"), *args]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "upsguard init: error:" in capsys.readouterr().err


def test_nut_address_refuses_a_bad_port() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="1 to 65535"):
        nut_address("nut.lab:70000")


def test_a_guest_is_vcenter_by_its_host_name_or_an_address() -> None:
    names, addresses = {"vcsa.lab.example"}, {"10.0.0.10"}
    nic = SimpleNamespace(ipAddress=["fe80::1", "10.0.0.10"])
    assert is_the_guest_of({"guest.hostName": "VCSA.lab.example."}, names, addresses)
    assert is_the_guest_of({"guest.net": [nic]}, names, addresses)
    assert is_the_guest_of({"guest.ipAddress": "10.0.0.10"}, names, addresses)
    assert not is_the_guest_of({"guest.hostName": "vcsa"}, names, addresses)
    assert not is_the_guest_of({}, names, addresses)
