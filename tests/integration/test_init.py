"""``upsguard init`` against upsguard-vcsim's lab and a real upsd, run as a person runs it:
the file it writes validates and plans, names every host, every VM but vCLS and every UPS,
and says with TODO comments what only a person knows. What cannot be read is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyVmomi import vim

from tests.peers.nut import ON_LINE, NutServer
from tests.peers.ports import free_port
from tests.peers.vcsim import Vcsim
from upsguard.config import load_site
from upsguard.models import ResourceKind

pytestmark = [pytest.mark.vcsim, pytest.mark.nut, pytest.mark.timeout(300)]


def upsguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "upsguard", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def init_args(sim: Vcsim, password_file: Path, nut_port: int, *extra: str) -> list[str]:
    return [
        "init",
        "--vcenter",
        f"https://{sim.host}:{sim.port}/sdk",
        "--user",
        sim.user,
        "--password-file",
        str(password_file),
        "--ca-file",
        str(sim.tls.ca_file),
        "--nut",
        f"127.0.0.1:{nut_port}",
        *extra,
    ]


@pytest.fixture
def password_file(lab: Vcsim, tmp_path: Path) -> Path:
    path = tmp_path / "vc.pw"
    path.write_text(lab.password + "\n")
    return path


@pytest.fixture
def upsd(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory(
        {"ups1": ON_LINE, "ups2": ON_LINE.replace("35", "60")}, ext="dev"
    )
    return server


def test_init_writes_a_site_that_validates_plans_and_names_everything(
    lab: Vcsim, upsd: NutServer, password_file: Path, tmp_path: Path
) -> None:
    site_file = tmp_path / "site.yaml"
    done = upsguard(*init_args(lab, password_file, upsd.port, "-o", str(site_file)))
    assert done.returncode == 0, done.stderr
    text = site_file.read_text()

    validated = upsguard("validate", "-c", str(site_file))
    assert validated.returncode == 0, validated.stderr
    planned = upsguard("plan", "shutdown", "-c", str(site_file))
    assert planned.returncode == 0, planned.stderr

    site = load_site(site_file)
    vms = sorted(r.vm or r.id for r in site.resources if r.kind is ResourceKind.VM)
    hosts = sorted(r.host or r.id for r in site.resources if r.kind is ResourceKind.HOST)
    real_vms = sorted(v.name for v in lab.all(vim.VirtualMachine) if not v.name.startswith("vCLS"))
    assert vms == real_vms
    assert hosts == sorted(h.name for h in lab.all_hosts())
    placed = {str(r.id): r.runs_on for r in site.resources if r.kind is ResourceKind.VM}
    assert placed["sql01"] == ["DC0_C0_H1"] and placed["stray-01"] == ["DC0_C0_H2"]
    assert sorted(u.name for u in site.ups) == ["ups1", "ups2"]
    assert all(u.nut is not None and u.nut.port == upsd.port for u in site.ups)
    assert sorted(f.ups[0] for f in site.feeds) == ["ups1", "ups2"]
    for step in ("stop:dc01", "stop:stray-01", "stop:DC0_C0_H2"):
        assert step in planned.stdout
    assert "vCLS-DC0_C0-1" not in planned.stdout
    for todo in ("depends_on", "runs_upsguard", "storage", "switches", "caches"):
        assert any(line.strip().startswith("# TODO:") and todo in line for line in _todos(text))
    assert lab.password not in text and str(password_file) in text
    printed = upsguard(*init_args(lab, password_file, upsd.port))
    assert printed.returncode == 0 and printed.stdout == text


def _todos(text: str) -> list[str]:
    """Each TODO comment with the comment lines that follow it."""
    found: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# TODO:"):
            found.append(stripped)
        elif stripped.startswith("#") and found and not stripped.startswith("# TODO"):
            found[-1] += " " + stripped.lstrip("# ")
    return found


def test_init_refuses_to_overwrite_without_force(
    lab: Vcsim, upsd: NutServer, password_file: Path, tmp_path: Path
) -> None:
    site_file = tmp_path / "site.yaml"
    site_file.write_text("site: mine\n")
    done = upsguard(*init_args(lab, password_file, upsd.port, "-o", str(site_file)))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"upsguard: {site_file} exists: give --force to overwrite it, or another -o"
    ]
    assert site_file.read_text() == "site: mine\n"
    forced = upsguard(*init_args(lab, password_file, upsd.port, "-o", str(site_file), "--force"))
    assert forced.returncode == 0, forced.stderr
    assert "kind: host" in site_file.read_text()


def test_upsd_not_listening_is_one_line_naming_it(
    lab: Vcsim, password_file: Path, tmp_path: Path
) -> None:
    port = free_port()
    done = upsguard(*init_args(lab, password_file, port, "-o", str(tmp_path / "site.yaml")))
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"upsguard: upsd 127.0.0.1:{port} cannot be reached")
    assert line.endswith("check --nut, and that upsd listens there (LISTEN in upsd.conf)")
    assert not (tmp_path / "site.yaml").exists()


def test_a_missing_password_file_is_one_line_naming_it(
    lab: Vcsim, upsd: NutServer, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.pw"
    done = upsguard(*init_args(lab, missing, upsd.port))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"upsguard: --password-file: {missing}: cannot read the file: No such file or "
        "directory: give a file holding the vCenter user's password"
    ]
    assert done.stdout == ""


def test_a_wrong_password_is_one_line_without_it(
    lab: Vcsim, upsd: NutServer, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("wrong-Secret-9\n")
    done = upsguard(*init_args(lab, wrong, upsd.port))
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert "refused the login" in line and "wrong-Secret-9" not in line
    assert done.stdout == ""


def test_vcenter_not_listening_is_one_line_naming_it(
    lab: Vcsim, upsd: NutServer, password_file: Path, tmp_path: Path
) -> None:
    port = free_port()
    args = init_args(lab, password_file, upsd.port, "-o", str(tmp_path / "site.yaml"))
    args[args.index("--vcenter") + 1] = f"https://127.0.0.1:{port}"
    done = upsguard(*args)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"upsguard: vsphere platform 'vcenter': cannot reach 127.0.0.1:{port}: connection "
        "refused: check --vcenter"
    ]
    assert not (tmp_path / "site.yaml").exists()
