"""``upsguard inventory`` and ``upsguard plan --live`` against upsguard-vcsim's lab inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.peers.ports import free_port
from tests.peers.vcsim import Vcsim
from upsguard.cli import main

pytestmark = pytest.mark.vcsim

LAB_RESOURCES: list[dict[str, Any]] = [
    {"id": "dc01", "kind": "vm", "platform": "vc", "guest_timeout": "20s"},
    {"id": "sql01", "kind": "vm", "platform": "vc", "depends_on": ["dc01"]},
    {
        "id": "web",
        "kind": "vm_group",
        "platform": "vc",
        "select": {"folder": "Prod/Web"},
        "depends_on": ["sql01"],
    },
    {
        "id": "app",
        "kind": "vm_group",
        "platform": "vc",
        "select": {"attribute": {"tier": "app"}},
        "depends_on": ["sql01"],
    },
    *(
        {"id": f"DC0_C0_H{i}", "kind": "host", "platform": "vc", "maintenance_mode": True}
        for i in range(3)
    ),
]


def write_site(
    sim: Vcsim,
    directory: Path,
    resources: list[dict[str, Any]] | None = None,
    password: str | None = None,
    extra_platforms: dict[str, Any] | None = None,
    **platform: Any,
) -> Path:
    """A site file whose vsphere platform 'vc' is the simulator (the UPS is never contacted)."""
    site = {
        "site": "lab",
        "journal": str(directory / "journal.sqlite"),
        "ups": [{"name": "ups-a", "nut": {"host": "127.0.0.1", "port": free_port(), "ups": "x"}}],
        "platforms": {
            "vc": sim.settings_dict(directory, password, **platform),
            **(extra_platforms or {}),
        },
        "resources": LAB_RESOURCES if resources is None else resources,
    }
    path = directory / "site.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return path


def test_inventory_text_shows_coverage_and_unplanned_vms(
    lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inventory", "-c", str(write_site(lab, tmp_path))]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "3 host(s), 7 VM(s)" in out and "clusters:    DC0_C0" in out
    assert rows["web-01"].endswith("web") and "Prod/Web" in rows["web-01"]
    assert "tier=app" in rows["app-01"] and "not running" in rows["app-01"]
    assert rows["vCLS-DC0_C0-1"].endswith("(system)")
    assert rows["stray-01"].endswith("UNPLANNED")
    assert (
        "unplanned: 1 VM(s) no resource covers; they get the site's default policy: stray-01" in out
    )


def test_inventory_json(lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "-c", str(write_site(lab, tmp_path)), "--format", "json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    vms = {vm["name"]: vm for vm in report["vms"]}
    assert report["unplanned"] == ["stray-01"]
    assert vms["sql01"]["resources"] == ["sql01"] and vms["sql01"]["host"] == "DC0_C0_H1"
    assert vms["dc01"]["attributes"] == {"tier": "infra"} and vms["dc01"]["folder"] == "Infra"
    assert vms["vCLS-DC0_C0-1"]["system"] and not vms["vCLS-DC0_C0-1"]["unplanned"]
    assert {h["name"]: h["power"] for h in report["hosts"]}["DC0_C0_H2"] == "poweredOn"


def test_inventory_reports_a_missing_vm_and_fails(
    lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resources = [*LAB_RESOURCES, {"id": "ghost", "kind": "vm", "platform": "vc"}]
    assert main(["inventory", "-c", str(write_site(lab, tmp_path, resources))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["upsguard: resource 'ghost': no VM named 'ghost' on vsphere platform 'vc'"]


def test_wrong_password_is_one_line(
    lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = write_site(lab, tmp_path, password="wrong-Secret")
    assert main(["inventory", "-c", str(site)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the login" in err[0] and "wrong-Secret" not in err[0]


def test_unreachable_vcenter_is_one_line(
    lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    site = write_site(lab, tmp_path, port=port)
    assert main(["inventory", "-c", str(site)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"upsguard: vsphere platform 'vc': cannot reach 127.0.0.1:{port}: connection refused"
    ]


def test_live_plan_places_vms_before_the_host_they_run_on(
    lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = write_site(lab, tmp_path)
    assert main(["plan", "shutdown", "-c", str(site), "--live", "--format", "json"]) == 0
    steps = {s["id"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    web_steps = sorted(s for s in steps if s.startswith("stop:web"))
    assert len(web_steps) == 2  # the folder selector found web-01 and web-02
    assert "stop:dc01" in steps["stop:DC0_C0_H0"]["waits_for"]  # dc01 runs on H0
    assert "stop:sql01" in steps["stop:DC0_C0_H1"]["waits_for"]  # sql01 runs on H1
    assert "stop:dc01" not in steps["stop:DC0_C0_H1"]["waits_for"]


def test_live_plan_text_shows_unplanned_vms_and_vms_without_tools(
    lab: Vcsim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = write_site(lab, tmp_path)
    assert main(["plan", "shutdown", "-c", str(site), "--live", "--format", "json"]) == 0
    steps = {s["id"]: s["description"] for s in json.loads(capsys.readouterr().out)["steps"]}
    (host_step,) = [sid for sid, text in steps.items() if "stray-01" in text]
    assert host_step.startswith("stop:DC0_C0_H")
    assert steps[host_step].startswith(
        "set HA host monitoring off and DRS to manual on its cluster (recorded), "
        "stop 1 VM(s) no resource covers (stray-01), "
    )
    (app_01,) = [sid for sid in steps if sid.endswith("app-01")]
    assert steps[app_01].endswith("; no VMware Tools: powered off at once")
    assert "VMware Tools" not in steps["stop:sql01"]
