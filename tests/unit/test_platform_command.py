"""The command and none platforms: real commands run by /bin/sh on this machine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from upsguard.clock import SystemClock
from upsguard.config.platforms import CommandSettings, implicit_platform
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError
from upsguard.models import PlatformName, PowerState, StopMethod
from upsguard.plugins import registry


def command_platform(**extra: Any) -> Any:
    settings = CommandSettings.model_validate(
        {"type": "command", "poll_interval": "0.05s", "timeout": "10s", **extra}
    )
    return registry.load("platform", "command")(PlatformName("command"), settings, SystemClock())


def device(tmp_path: Path, **commands: str) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": "tape-lib", "kind": "storage", "platform": "command", **commands}
    )


def test_status_command_tracks_the_real_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("on\n")
    log = tmp_path / "log"
    res = device(
        tmp_path,
        shutdown=f"echo off > {state}; echo shutdown >> {log}",
        startup=f"(sleep 0.3; echo on > {state}) & echo startup >> {log}",
        status=f'test "$(cat {state})" = on',
    )

    async def scenario() -> list[Any]:
        cmd = command_platform()
        [target] = await cmd.resolve(res)
        seen: list[Any] = [await cmd.power_state(target)]
        await cmd.stop(target, StopMethod.GRACEFUL)
        seen += [await cmd.wait_for(target, PowerState.OFF, 5), await cmd.healthy(target)]
        await cmd.start(target)
        seen += [await cmd.wait_for(target, PowerState.ON, 5), await cmd.healthy(target)]
        return seen

    assert asyncio.run(scenario()) == [PowerState.ON, True, False, True, True]
    assert log.read_text().split() == ["shutdown", "startup"]


def test_commands_get_only_the_basics_and_pass_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's environment holds the secrets password_env names: not for a command."""
    monkeypatch.setenv("REDFISH_PASSWORD", "Rf2-env-SECRET")
    monkeypatch.setenv("TAPE_LIBRARY", "lib0")
    dump = tmp_path / "env"
    res = device(tmp_path, shutdown=f"env > {dump}")

    async def scenario() -> None:
        cmd = command_platform(pass_env=["TAPE_LIBRARY"])
        [target] = await cmd.resolve(res)
        await cmd.stop(target, StopMethod.GRACEFUL)

    asyncio.run(scenario())
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert env["TAPE_LIBRARY"] == "lib0" and "PATH" in env
    assert "REDFISH_PASSWORD" not in env and "SECRET" not in dump.read_text()


def test_without_status_the_last_command_decides(tmp_path: Path) -> None:
    res = device(tmp_path, shutdown="true", startup="true")

    async def scenario() -> list[Any]:
        cmd = command_platform()
        [target] = await cmd.resolve(res)
        seen: list[Any] = [await cmd.power_state(target)]
        await cmd.stop(target, StopMethod.GRACEFUL)
        seen += [await cmd.wait_for(target, PowerState.OFF, 0), await cmd.power_state(target)]
        return seen

    assert asyncio.run(scenario()) == [PowerState.UNKNOWN, True, PowerState.OFF]


def test_a_failing_command_names_the_resource_and_its_error(tmp_path: Path) -> None:
    res = device(tmp_path, shutdown="echo 'array busy: rebuild running' >&2; exit 3")

    async def scenario() -> None:
        cmd = command_platform()
        [target] = await cmd.resolve(res)
        await cmd.stop(target, StopMethod.GRACEFUL)

    with pytest.raises(PermanentError) as err:
        asyncio.run(scenario())
    assert str(err.value) == (
        "resource 'tape-lib': shutdown command exited 3: array busy: rebuild running"
    )


def test_no_hard_stop_and_no_missing_command(tmp_path: Path) -> None:
    res = device(tmp_path, shutdown="true")

    async def scenario(action: str) -> None:
        cmd = command_platform()
        [target] = await cmd.resolve(res)
        if action == "hard":
            await cmd.stop(target, StopMethod.HARD)
        else:
            await cmd.start(target)

    with pytest.raises(PermanentError, match="no hard power-off"):
        asyncio.run(scenario("hard"))
    with pytest.raises(PermanentError, match="'tape-lib' has no 'startup' command"):
        asyncio.run(scenario("start"))


def test_none_platform_leaves_the_resource_to_the_ups(caplog: pytest.LogCaptureFixture) -> None:
    res = ResourceConfig.model_validate({"id": "core-sw", "kind": "switch", "platform": "none"})
    cls = registry.load("platform", "none")
    none = cls(PlatformName("none"), implicit_platform("none"), SystemClock())

    async def scenario() -> list[Any]:
        [target] = await none.resolve(res)
        await none.stop(target, StopMethod.GRACEFUL)
        return [await none.power_state(target), await none.wait_for(target, PowerState.OFF, 1)]

    with caplog.at_level("INFO"):
        assert asyncio.run(scenario()) == [PowerState.UNKNOWN, True]
    assert "core-sw is left to the UPS" in caplog.text
