"""Both UPS sources honour the UpsSource contract's construction and error rules."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from upsguard.clock import SystemClock
from upsguard.config.ups import UpsConfig
from upsguard.errors import ConfigError, PermanentError, UpsUnreachable
from upsguard.plugins import catalog
from upsguard.plugins.ups.base import UpsSource

NUT = {"name": "a", "nut": {"ups": "ups1", "port": 1}}
SNMP = {"name": "b", "snmp": {"host": "127.0.0.1", "port": 1, "allow_public_community": True}}


@pytest.mark.parametrize(("kind", "entry"), [("nut", NUT), ("snmp", SNMP)])
def test_registry_builds_a_ups_source(kind: str, entry: dict[str, object]) -> None:
    cls = catalog.load("ups", kind)
    source = cls(UpsConfig.model_validate(entry), SystemClock())
    assert isinstance(source, UpsSource) and source.name == entry["name"]


def test_missing_password_file_names_the_file_not_a_secret(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pw"
    config = UpsConfig.model_validate(
        {"name": "a", "nut": {"ups": "u", "port": 1, "user": "mon", "password_file": missing}}
    )
    source = catalog.load("ups", "nut")(config, SystemClock())
    with pytest.raises(ConfigError, match=r"nope\.pw"):
        asyncio.run(source.read())


def test_an_error_that_names_its_ups_already_is_not_named_twice() -> None:
    config = UpsConfig.model_validate({"name": "cp1500", "nut": {"ups": "u", "user": "mon"}})
    source = catalog.load("ups", "nut")(config, SystemClock())
    with pytest.raises(ConfigError) as caught:
        asyncio.run(source.read())
    assert str(caught.value).startswith("UPS cp1500: NUT user 'mon'"), caught.value
    assert str(caught.value).count("cp1500") == 1


def test_inline_password_is_refused() -> None:
    with pytest.raises(ValueError, match="inline 'password'"):
        UpsConfig.model_validate(
            {"name": "a", "nut": {"ups": "u", "user": "mon", "password": "secret"}}
        )


def test_snmp_refuses_a_command_its_mib_has_no_set_for_before_any_packet() -> None:
    source = catalog.load("ups", "snmp")(UpsConfig.model_validate(SNMP), SystemClock())
    with pytest.raises(PermanentError, match=r"'test\.battery\.start'.*ups-mib"):
        asyncio.run(source.command("test.battery.start"))


@pytest.mark.parametrize(
    ("kind", "entry"), [("nut", NUT), ("snmp", SNMP), ("simulated", {"name": "c", "simulated": {}})]
)
def test_a_source_without_a_news_channel_returns_at_once(
    kind: str, entry: dict[str, object]
) -> None:
    source = catalog.load("ups", kind)(UpsConfig.model_validate(entry), SystemClock())
    asyncio.run(source.watch_for_changes(lambda: None))


def test_nut_commands_need_a_user() -> None:
    source = catalog.load("ups", "nut")(UpsConfig.model_validate(NUT), SystemClock())
    with pytest.raises(ConfigError, match="instcmds"):
        asyncio.run(source.command("load.off"))


def test_snmp_unresolvable_host_is_unreachable_not_a_crash() -> None:
    entry = {
        "name": "b",
        "snmp": {"host": "no-such-host.invalid", "timeout": "0.2s", "allow_public_community": True},
    }
    source = catalog.load("ups", "snmp")(UpsConfig.model_validate(entry), SystemClock())
    with pytest.raises(UpsUnreachable, match=r"no-such-host\.invalid"):
        asyncio.run(source.read())
