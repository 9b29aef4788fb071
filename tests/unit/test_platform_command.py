"""The command and none platforms: real commands run by /bin/sh on this machine."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from upsguard.clock import SystemClock
from upsguard.config.platforms import CommandSettings, implicit_platform
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError
from upsguard.models import CommandProcess, PlatformName, PowerState, StopMethod
from upsguard.plugins import catalog, processes


def command_platform(**extra: Any) -> Any:
    state_dir = tempfile.mkdtemp(prefix="upsguard-commands-")
    settings = CommandSettings.model_validate(
        {
            "type": "command",
            "poll_interval": "0.05s",
            "timeout": "10s",
            "state_dir": state_dir,
            **extra,
        }
    )
    return catalog.load("platform", "command")(PlatformName("command"), settings, SystemClock())


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
    cls = catalog.load("platform", "none")
    none = cls(PlatformName("none"), implicit_platform("none"), SystemClock())

    async def scenario() -> list[Any]:
        [target] = await none.resolve(res)
        await none.stop(target, StopMethod.GRACEFUL)
        return [await none.power_state(target), await none.wait_for(target, PowerState.OFF, 1)]

    with caplog.at_level("INFO"):
        assert asyncio.run(scenario()) == [PowerState.UNKNOWN, True]
    assert "core-sw is left to the UPS" in caplog.text


def started_before_the_restart(tmp_path: Path, command: str) -> tuple[CommandProcess, Any]:
    """A command started as the platform starts it, by a controller that then died: what the
    journal kept of it, and the process (to reap it)."""
    exit_file = tmp_path / "run1.stop_tape-lib.exit"
    proc = subprocess.Popen(
        ["/bin/sh", "-c", processes.WRAPPER, str(exit_file), "/bin/sh", "-c", command],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    found = processes.identify(proc.pid)
    assert found is not None
    ticks, session = found
    return CommandProcess(proc.pid, ticks, session, str(exit_file), datetime.now(UTC)), proc


def test_a_command_still_running_after_a_restart_is_waited_for_not_run_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    gate = tmp_path / "gate"
    gate.touch()
    first, proc = started_before_the_restart(
        tmp_path, f"while [ -e {gate} ]; do sleep 0.02; done; echo first >> {log}"
    )
    res = device(tmp_path, shutdown=f"echo again >> {log}")

    async def scenario() -> list[Any]:
        cmd = command_platform()
        [target] = await cmd.resolve(res)
        cmd.adopt(target, PowerState.OFF, first)
        under_way = await cmd.in_flight(target, PowerState.OFF)
        gate.unlink()  # the first command may end now
        landed = await cmd.wait_for(target, PowerState.OFF, 10)
        return [under_way, landed, await cmd.in_flight(target, PowerState.OFF)]

    under_way, landed, after = asyncio.run(scenario())
    proc.wait(5)
    assert under_way is not None and f"pid {first.pid}" in under_way
    assert "started before the restart" in under_way
    assert (landed, after) == (True, None)
    assert log.read_text().split() == ["first"]  # judged by its exit status, never run again


def test_a_journaled_pid_with_another_start_time_is_not_that_command(tmp_path: Path) -> None:
    """The kernel gave the PID to another process (here: this test's own): the command the
    journal names has ended, its exit status is lost, and the status command says the device
    is still on: the step runs the command."""
    log = tmp_path / "log"
    state = tmp_path / "state"
    state.write_text("on\n")
    ticks, session = processes.identify(os.getpid()) or (0, 0)
    exit_file = str(tmp_path / "run1.stop_tape-lib.exit")
    reused = CommandProcess(os.getpid(), ticks + 1, session, exit_file, datetime.now(UTC))
    res = device(
        tmp_path,
        shutdown=f"echo off > {state}; echo shutdown >> {log}",
        status=f'test "$(cat {state})" = on',
    )

    async def scenario() -> list[Any]:
        cmd = command_platform(state_dir=str(tmp_path))
        [target] = await cmd.resolve(res)
        cmd.adopt(target, PowerState.OFF, reused)
        seen: list[Any] = [await cmd.in_flight(target, PowerState.OFF)]
        await cmd.request(target, PowerState.OFF, "run1.stop:tape-lib", lambda p: None)
        return [*seen, await cmd.wait_for(target, PowerState.OFF, 5)]

    assert asyncio.run(scenario()) == [None, True]
    assert log.read_text().split() == ["shutdown"]


def test_without_exit_status_or_status_command_the_step_is_not_done(tmp_path: Path) -> None:
    """The command's whole session was killed with the controller: nothing says whether the
    device went down. Unknown is not done, and the command is not run again."""
    log = tmp_path / "log"
    gone = CommandProcess(2**22 + 1, 1, 2**22 + 1, str(tmp_path / "x.exit"), datetime.now(UTC))
    res = device(tmp_path, shutdown=f"echo again >> {log}")

    async def scenario() -> None:
        cmd = command_platform(state_dir=str(tmp_path))
        [target] = await cmd.resolve(res)
        cmd.adopt(target, PowerState.OFF, gone)
        await cmd.wait_for(target, PowerState.OFF, 5)

    with pytest.raises(PermanentError, match="ended without leaving its exit status") as err:
        asyncio.run(scenario())
    assert "no 'status' command" in str(err.value) and "not run again" in str(err.value)
    assert not log.exists()


@pytest.mark.parametrize("outcome", ["done", "fails"])
def test_a_state_dir_that_cannot_be_written_never_stops_a_command(
    tmp_path: Path, outcome: str
) -> None:
    """The journal's directory read-only (the exit status is kept beside it): every command
    step of the shutdown failed, "cannot write its command's exit status". The journal is a
    record, not a precondition: the command runs as a plain child, judged by its exit code."""
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")  # a file where the folder should be: even root cannot write in it
    marker = tmp_path / "ran"
    tail = "" if outcome == "done" else "; echo 'array busy' >&2; exit 3"
    res = device(tmp_path, shutdown=f"touch {marker}{tail}")

    async def scenario() -> None:
        cmd = command_platform(state_dir=str(blocked / "commands"))
        [target] = await cmd.resolve(res)
        await cmd.stop(target, StopMethod.GRACEFUL)

    if outcome == "done":
        asyncio.run(scenario())
    else:
        with pytest.raises(PermanentError, match="shutdown command exited 3: array busy"):
            asyncio.run(scenario())
    assert marker.exists()
