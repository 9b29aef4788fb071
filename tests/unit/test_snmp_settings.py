"""An SNMP UPS entry says its security explicitly, and validate refuses a command its MIB
cannot send; each mistake is one line naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.sites import write_site
from upsguard.config import load_site
from upsguard.config.ups import SnmpSettings, UpsConfig
from upsguard.errors import ConfigError
from upsguard.plugins.ups.snmp.control import SETS

SITE = """\
site: hq
ups:
  - name: ups-a
    snmp: {SNMP}
resources:
  - {id: core-sw, kind: switch}
"""


def problems(tmp_path: Path, snmp: str, extra: str = "") -> list[str]:
    text = SITE.replace("{SNMP}", snmp)
    if extra:
        text = text.replace("    snmp:", f"    {extra}\n    snmp:")
    with pytest.raises(ConfigError) as info:
        load_site(write_site(tmp_path, text))
    return info.value.problems


def loads(tmp_path: Path, snmp: str) -> None:
    load_site(write_site(tmp_path, SITE.replace("{SNMP}", snmp)))


@pytest.mark.parametrize("version", ["1", "2c"])
def test_v1_v2c_without_a_community_is_an_error_not_public(tmp_path: Path, version: str) -> None:
    (only,) = problems(tmp_path, f'{{host: 10.0.0.5, version: "{version}"}}')
    assert only.startswith("ups[0].snmp: ")
    assert "community_file or community_env" in only and "allow_public_community: true" in only
    assert "\n" not in only


def test_public_written_out_loads(tmp_path: Path) -> None:
    loads(tmp_path, "{host: 10.0.0.5, allow_public_community: true}")
    loads(tmp_path, "{host: 10.0.0.5, community_env: UPS_COMMUNITY}")
    loads(tmp_path, "{host: 10.0.0.5, community_file: /etc/upsguard/ups.community}")


def test_inline_community_is_refused_like_an_inline_password(tmp_path: Path) -> None:
    (only,) = problems(tmp_path, "{host: 10.0.0.5, community: s3cret}")
    assert "inline 'community' is not accepted" in only and "community_file" in only
    assert "s3cret" not in only


def test_public_and_a_community_file_is_a_choice_to_make(tmp_path: Path) -> None:
    (only,) = problems(tmp_path, "{host: 10.0.0.5, allow_public_community: true, community_env: C}")
    assert "choose one" in only


def test_v3_without_an_auth_key_is_an_error_not_noauth(tmp_path: Path) -> None:
    (only,) = problems(tmp_path, '{host: 10.0.0.5, version: "3", user: ups}')
    assert only.startswith("ups[0].snmp: ")
    assert "auth_key_file or auth_key_env" in only and "security: noAuthNoPriv" in only


def test_v3_levels_written_or_made_by_the_keys(tmp_path: Path) -> None:
    loads(tmp_path, '{host: h, version: "3", user: ups, security: noAuthNoPriv}')
    loads(tmp_path, '{host: h, version: "3", user: ups, auth_key_env: A}')
    loads(tmp_path, '{host: h, version: "3", user: ups, auth_key_env: A, priv_key_env: P}')
    loads(tmp_path, '{host: h, version: "3", user: ups, security: authNoPriv, auth_key_env: A}')
    (mismatch,) = problems(
        tmp_path, '{host: h, version: "3", user: ups, security: authPriv, auth_key_env: A}'
    )
    assert "security: authPriv" in mismatch and "authNoPriv" in mismatch
    (priv_only,) = problems(tmp_path, '{host: h, version: "3", user: ups, priv_key_env: P}')
    assert "privacy needs an auth key" in priv_only


def test_traps_are_off_unless_a_port_is_given() -> None:
    entry: dict[str, Any] = {"name": "b", "snmp": {"host": "h", "allow_public_community": True}}
    snmp = UpsConfig.model_validate(entry).snmp
    assert snmp is not None and snmp.trap_port is None


def test_a_command_the_mib_cannot_send_is_a_config_error(tmp_path: Path) -> None:
    (only,) = problems(
        tmp_path,
        "{host: 10.0.0.5, mib: powernet, allow_public_community: true}",
        extra="at_shutdown_end: {command: beeper.disable}",
    )
    assert only.startswith("ups[0].at_shutdown_end.command: ")
    assert "beeper.disable" in only and "powernet" in only and "shutdown.return" in only


@pytest.mark.parametrize("mib", ["ups-mib", "powernet"])
@pytest.mark.parametrize(
    "command", ["shutdown.return", "shutdown.stayoff", "load.off", "load.off.delay"]
)
def test_the_nut_style_commands_pass_validate(tmp_path: Path, mib: str, command: str) -> None:
    text = SITE.replace("{SNMP}", f"{{host: h, mib: {mib}, allow_public_community: true}}")
    text = text.replace("    snmp:", f"    at_shutdown_end: {{command: {command}}}\n    snmp:")
    load_site(write_site(tmp_path, text))


def test_validate_knows_exactly_the_commands_the_source_has_sets_for() -> None:
    assert {mib: frozenset(sets) for mib, sets in SETS.items()} == dict(SnmpSettings.COMMANDS)
