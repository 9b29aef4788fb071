"""Every mistake in a site file gives one line naming the field path and file:line."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sites import EXAMPLES, write_site
from upsguard.cli import main
from upsguard.config import load_site
from upsguard.config.platforms import RedfishSettings, WolSettings
from upsguard.errors import ConfigError

GOOD = """\
site: hq
ups:
  - name: ups-a
    nut: {host: 127.0.0.1, ups: cp1500, user: mon, password_file: /etc/upsguard/nut.pw}
    runtime_at: {minutes: 30, load_watts: 400}
platforms:
  vcenter: {type: vsphere, host: vcsa.lab, user: u, password_env: VC_PASSWORD}
resources:
  - {id: dc01, kind: vm, platform: vcenter}
  - {id: sql01, kind: vm, platform: vcenter, depends_on: [dc01]}
  - {id: app01, kind: vm, platform: vcenter, depends_on: [sql01]}
  - {id: esx01, kind: host, platform: vcenter}
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_site(write_site(tmp_path, text))
    return info.value.problems


def test_good_site_loads(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path, GOOD))
    assert [r.id for r in site.resources] == ["dc01", "sql01", "app01", "esx01"]
    assert site.resource("sql01").depends_on == ["dc01"]


def test_unknown_reference_names_path_and_line(tmp_path: Path) -> None:
    text = GOOD.replace("depends_on: [dc01]}", "depends_on: [dc01, sql02]}")
    site_file = tmp_path / "site.yaml"
    assert problems(tmp_path, text) == [
        f"resources[1].depends_on[1]: unknown resource 'sql02' (did you mean 'sql01'?) "
        f"({site_file}:10)"
    ]


def test_cycle_is_spelled_out(tmp_path: Path) -> None:
    text = GOOD.replace(
        "{id: dc01, kind: vm, platform: vcenter}",
        "{id: dc01, kind: vm, platform: vcenter, depends_on: [app01]}",
    )
    (only,) = problems(tmp_path, text)
    assert "cycle: " in only
    loop = only.split("cycle: ")[1].split(" (")[0]
    assert loop in (
        "dc01 -> app01 -> sql01 -> dc01",
        "app01 -> sql01 -> dc01 -> app01",
        "sql01 -> dc01 -> app01 -> sql01",
    )


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace(
        "platform: vcenter, depends_on: [sql01]", "platform: vcentre, depends_on: [sql01, nope]"
    )
    text = text.replace(
        "{id: esx01, kind: host, platform: vcenter}",
        "{id: esx01, kind: host, platform: vcenter, watts: -5, colour: red}",
    )
    found = problems(tmp_path, text)
    assert len(found) == 4  # field and reference problems in one pass
    assert any("resources[3].watts" in p and ":12)" in p for p in found)
    assert any("resources[3].colour: unknown field 'colour'" in p for p in found)
    assert any("resources[2].platform: unknown platform 'vcentre'" in p for p in found)
    assert any("resources[2].depends_on[1]: unknown resource 'nope'" in p for p in found)


def test_typo_in_field_suggests_the_right_name(tmp_path: Path) -> None:
    text = GOOD.replace("{type: vsphere, host: vcsa.lab", "{type: vsphere, hots: vcsa.lab")
    found = problems(tmp_path, text)
    assert any(
        "platforms.vcenter.hots: unknown field 'hots' (did you mean 'host'?)" in p and ":7)" in p
        for p in found
    )


def test_bad_duration_is_explained(tmp_path: Path) -> None:
    text = GOOD.replace(
        "{id: dc01, kind: vm, platform: vcenter}",
        "{id: dc01, kind: vm, platform: vcenter, guest_timeout: 5 minutes}",
    )
    (only,) = problems(tmp_path, text)
    assert only.startswith("resources[0].guest_timeout: '5 minutes' is not a duration")


def test_inline_password_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace("password_env: VC_PASSWORD", "password: hunter2")
    (only,) = problems(tmp_path, text)
    assert "inline 'password' is not accepted" in only
    assert "hunter2" not in only


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    (only,) = problems(tmp_path, GOOD + "  - {id: broken, kind: vm\n")
    assert only.startswith(f"{tmp_path / 'site.yaml'}:")
    assert "not valid YAML" in only


def test_a_duplicated_key_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    text = GOOD.replace("{id: dc01, kind: vm,", "{id: dc01, kind: vm, kind: host,")
    (only,) = problems(tmp_path, text)
    assert only == f"resources[0].kind: key given twice: keep one ({tmp_path / 'site.yaml'}:9)"


def test_a_yaml_tag_is_refused_with_its_path(tmp_path: Path) -> None:
    text = GOOD.replace("platform: vcenter, depends_on: [dc01]}", "platform: !env VC}")
    (only,) = problems(tmp_path, text)
    assert only == (
        f"resources[1].platform: YAML tag '!env' is not supported ({tmp_path / 'site.yaml'}:10)"
    )


def test_merge_keys_and_yaml_1_2_words(tmp_path: Path) -> None:
    """``<<: *anchor`` shares settings; ``no`` is a name, not a boolean (YAML 1.2)."""
    text = GOOD.replace(
        "  - {id: esx01, kind: host, platform: vcenter}\n",
        "  - &host {id: esx01, kind: host, platform: vcenter, maintenance_mode: true}\n"
        "  - {<<: *host, id: no}\n",
    )
    site = load_site(write_site(tmp_path, text))
    assert site.resource("no").kind == "host"
    assert site.resource("no").maintenance_mode is True


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_site(tmp_path / "absent.yaml")


def test_vm_group_needs_a_selector(tmp_path: Path) -> None:
    text = GOOD + "  - {id: web, kind: vm_group, platform: vcenter}\n"
    (only,) = problems(tmp_path, text)
    assert only.startswith("resources[4]: a vm_group needs 'select'")


def test_feed_references(tmp_path: Path) -> None:
    text = GOOD + "feeds:\n  - {ups: [ups-a, ups-c], min_supplies: 3, powers: [esx01, esx02]}\n"
    found = problems(tmp_path, text)
    assert any(p.startswith("feeds[0].ups[1]: unknown UPS 'ups-c'") for p in found)
    assert any(p.startswith("feeds[0].powers[1]: unknown resource 'esx02'") for p in found)
    assert any(p.startswith("feeds[0].min_supplies: needs 3 supplies") for p in found)


def test_cli_prints_one_line_per_problem_and_exits_2(tmp_path: Path) -> None:
    path = write_site(tmp_path, GOOD.replace("depends_on: [sql01]", "depends_on: [sql9]"))
    done = subprocess.run(
        [sys.executable, "-m", "upsguard", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"upsguard: resources[2].depends_on[0]: unknown resource 'sql9' (did you mean "
        f"'sql01'?) ({path}:11)"
    ]
    assert "Traceback" not in done.stderr


def test_cli_validate_ok(tmp_path: Path) -> None:
    path = write_site(tmp_path, GOOD)
    done = subprocess.run(
        [sys.executable, "-m", "upsguard", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "ok: site 'hq'" in done.stdout


def test_a_url_in_a_flow_mapping_reads_as_yaml_1_2(tmp_path: Path) -> None:
    """libyaml refuses ``{host: https://x}``; YAML 1.2 allows it, and so does upsguard."""
    text = GOOD.replace(
        "  vcenter: {type: vsphere, host: vcsa.lab,",
        "  bmc: {type: redfish, host: https://10.0.1.21, user: u, password_env: BMC_PW}\n"
        "  vcenter: {type: vsphere, host: vcsa.lab,",
    )
    site = load_site(write_site(tmp_path, text))
    bmc = site.platforms["bmc"]
    assert isinstance(bmc, RedfishSettings) and bmc.host == "https://10.0.1.21"


def test_yaml_errors_name_the_line_and_what_is_wrong(tmp_path: Path) -> None:
    site_file = tmp_path / "site.yaml"
    (only,) = problems(tmp_path, GOOD.replace("{id: dc01, kind: vm,", "{id: dc01, kind: [vm,"))
    assert only == (
        f"{site_file}:9: not valid YAML: did not find expected ',' or ']' (while parsing a flow "
        "sequence)"
    )


def test_validate_warns_of_what_can_never_be_powered_on(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "site: t\nups: [{name: u, simulated: {}}]\n"
        "resources:\n"
        "  - {id: nas, kind: storage, platform: ssh, host: 10.0.0.9, shutdown: poweroff}\n"
        "  - {id: nas2, kind: storage, platform: ssh, host: 10.0.0.8, shutdown: poweroff,\n"
        "     start: false}\n"
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["validate", "-c", str(site)]) == 0
    (line,) = err.getvalue().splitlines()
    assert line.startswith("upsguard: warning: resources[0]: nas can never be powered on")
    assert line.endswith(f"({site}:4)")


def test_an_unknown_key_brought_in_by_a_merge_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("site: t\nups: [{<<: {bogus: 1}, name: v, simulated: {}}]\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["validate", "-c", str(site)]) == 2
    assert err.getvalue().splitlines() == [
        f"upsguard: ups[0].bogus: unknown field 'bogus' ({site}:2)"
    ]


def test_a_merged_key_is_placed_where_it_is_written(tmp_path: Path) -> None:
    """An anchor shared by several entries: each entry's problem names its own path, and the
    line where the key is written, which is where it is fixed."""
    text = GOOD.replace(
        "  - {id: esx01, kind: host, platform: vcenter}\n",
        "  - &host {id: esx01, kind: host, platform: vcenter,\n"
        "      maintenance_mod: true}\n"
        "  - {<<: *host, id: esx02}\n",
    )
    site_file = tmp_path / "site.yaml"
    assert problems(tmp_path, text) == [
        f"resources[{i}].maintenance_mod: unknown field 'maintenance_mod' (did you mean "
        f"'maintenance_mode'?) ({site_file}:13)"
        for i in (3, 4)
    ]


HOST_NEEDS_ITS_VM = GOOD.replace(
    "{id: dc01, kind: vm, platform: vcenter}",
    "{id: dc01, kind: vm, platform: vcenter, runs_on: [esx01]}",
).replace(
    "{id: esx01, kind: host, platform: vcenter}",
    "{id: esx01, kind: host, platform: vcenter, depends_on: [dc01]}",
)


def test_a_host_that_depends_on_a_vm_it_runs_is_a_cycle_named_by_its_placement(
    tmp_path: Path,
) -> None:
    """The planner's ``ValueError: the plan has a cycle`` came out as a traceback: the
    check of cycles read depends_on alone, not where the site file runs each VM."""
    site_file = tmp_path / "site.yaml"
    assert problems(tmp_path, HOST_NEEDS_ITS_VM) == [
        "resources[3].depends_on[0]: cycle: esx01 -> dc01 -> esx01 (dc01 runs on esx01, "
        "its runs_on): a host cannot need a VM that runs on it; drop the dependency, or "
        f"run the VM elsewhere ({site_file}:12)"
    ]


def test_a_host_that_depends_on_a_vm_of_unknown_placement_on_its_platform_is_a_cycle(
    tmp_path: Path,
) -> None:
    """Such a VM stops before every host of its platform, that host among them."""
    text = GOOD.replace(
        "{id: esx01, kind: host, platform: vcenter}",
        "{id: esx01, kind: host, platform: vcenter, depends_on: [dc01]}",
    )
    (only,) = problems(tmp_path, text)
    assert only.startswith(
        "resources[3].depends_on[0]: cycle: esx01 -> dc01 -> esx01 (dc01 has no runs_on: it "
        "may run on any host of platform vcenter)"
    )


@pytest.mark.parametrize(
    "command", [["validate"], ["plan", "shutdown"], ["simulate"], ["runbook"], ["doctor"]]
)
def test_every_command_refuses_a_placement_cycle_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    site = write_site(tmp_path, HOST_NEEDS_ITS_VM)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main([*command, "-c", str(site)]) == 2
    (line,) = err.getvalue().splitlines()
    assert line.startswith("upsguard: resources[3].depends_on[0]: cycle: esx01 -> dc01 -> esx01")


WAKE = GOOD.replace(
    "  vcenter: {type: vsphere,",
    "  wake: {type: wol, broadcast: 192.168.1.255}\n  vcenter: {type: vsphere,",
)


def test_a_machine_woken_by_wake_on_lan_needs_its_mac(tmp_path: Path) -> None:
    """validate accepted it and only doctor failed it: the homelab example's ESXi hosts could
    not be powered back on."""
    site_file = tmp_path / "site.yaml"
    text = WAKE.replace(
        "{id: esx01, kind: host, platform: vcenter}",
        "{id: esx01, kind: host, platform: vcenter, power_on_via: wake}",
    )
    assert problems(tmp_path, text) == [
        "resources[3].power_on_via: 'wake' wakes esx01 with Wake-on-LAN, which needs its "
        f"MAC address: set mac like 'aa:bb:cc:dd:ee:ff' ({site_file}:13)"
    ]
    malformed = text.replace("power_on_via: wake}", "power_on_via: wake, mac: 'aa:bb:cc'}")
    (only,) = problems(tmp_path, malformed)
    assert only.startswith("resources[3].mac: not a MAC address: 'aa:bb:cc'")
    good = text.replace("power_on_via: wake}", "power_on_via: wake, mac: 'AA-BB-CC-DD-EE-01'}")
    assert load_site(write_site(tmp_path, good)).resource("esx01").mac == "AA-BB-CC-DD-EE-01"


def test_the_examples_validate_and_can_power_each_host_back_on() -> None:
    for name in ("homelab.yaml", "cluster.yaml"):
        site = load_site(EXAMPLES / name)
        for res in site.resources:
            if res.power_on_via and isinstance(site.platform(res.power_on_via), WolSettings):
                assert res.mac, f"{name}: {res.id} has no mac"


def test_ssh_once_is_for_resources_on_an_ssh_platform(tmp_path: Path) -> None:
    site_file = tmp_path / "site.yaml"
    text = GOOD + "  - {id: nas01, kind: storage, platform: vcenter, ssh: {once: true}}\n"
    assert problems(tmp_path, text) == [
        "resources[4].ssh: 'ssh' is for resources on an ssh platform; 'vcenter' is not one: "
        f"remove it, or put nas01 on an ssh platform ({site_file}:13)"
    ]
    typo = (
        GOOD
        + "  - {id: nas01, kind: storage, platform: ssh, shutdown: poweroff, ssh: {onse: true}}\n"
    )
    (only,) = problems(tmp_path, typo)
    assert only.startswith("resources[4].ssh.onse:")
    for platform in ("ssh", "nas"):
        good = GOOD.replace("platforms:\n", "platforms:\n  nas: {type: ssh}\n") + (
            f"  - {{id: nas01, kind: storage, platform: {platform}, shutdown: poweroff,"
            " ssh: {once: true}}\n"
        )
        res = load_site(write_site(tmp_path, good)).resource("nas01")
        assert res.ssh is not None and res.ssh.once
