"""The ssh platform against a real OpenSSH server on loopback (tests/peers/sshd.py).

The "device" is a script reached over SSH that records the shutdown it was
sent and reports its state through a status command, as a NAS would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_port
from tests.peers.sshd import Sshd, lock_of_its_own
from upsguard.clock import SystemClock
from upsguard.config.platforms import SshSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, PlatformUnreachable
from upsguard.models import PlatformName, PowerState, StopMethod
from upsguard.plugins import catalog
from upsguard.plugins.platforms.ssh import command_argv

pytestmark = pytest.mark.sshd

DEVICE = """#!/bin/sh
dir=$(dirname "$0")
case "$1" in
  shutdown) echo shutdown >> "$dir/log"; (sleep 0.3; echo off > "$dir/state") >/dev/null 2>&1 & ;;
  status) test "$(cat "$dir/state")" = on ;;
  startup) echo startup >> "$dir/log"; echo on > "$dir/state" ;;
  refuse) echo "shutdown refused: volume resync in progress" >&2; exit 4 ;;
esac
"""


class Device:
    def __init__(self, base: Path) -> None:
        self.script = base / "device.sh"
        self.script.write_text(DEVICE)
        self.script.chmod(0o755)
        (base / "state").write_text("on\n")
        self.log = base / "log"

    def actions(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


def platform(sshd: Sshd, **extra: Any) -> Any:
    settings = SshSettings.model_validate(
        {
            "type": "ssh",
            "user": sshd.user,
            "port": sshd.port,
            "key_file": str(sshd.key_file),
            "known_hosts": str(sshd.known_hosts),
            "poll_interval": "0.1s",
            "timeout": "10s",
            **extra,
        }
    )
    return catalog.load("platform", "ssh")(PlatformName("ssh"), settings, SystemClock())


def nas(**fields: Any) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": "nas01", "kind": "storage", "platform": "ssh", "host": "127.0.0.1", **fields}
    )


def test_shuts_the_nas_down_and_sees_it_go(sshd: Sshd, tmp_path: Path) -> None:
    device = Device(tmp_path)
    res = nas(shutdown=f"{device.script} shutdown", status=f"{device.script} status")

    async def scenario() -> list[Any]:
        ssh = platform(sshd)
        [target] = await ssh.resolve(res)
        seen: list[Any] = [await ssh.power_state(target)]
        await ssh.stop(target, StopMethod.GRACEFUL)
        seen += [await ssh.wait_for(target, PowerState.OFF, 10), await ssh.power_state(target)]
        await ssh.close()
        return seen

    assert asyncio.run(scenario()) == [PowerState.ON, True, PowerState.OFF]
    assert device.actions() == ["shutdown"]


def test_a_device_dropping_the_connection_has_accepted_the_shutdown(sshd: Sshd) -> None:
    """``poweroff`` on a real box kills the session before any exit status is sent."""
    res = nas(shutdown="kill -KILL $PPID")

    async def scenario() -> None:
        ssh = platform(sshd)
        [target] = await ssh.resolve(res)
        await ssh.stop(target, StopMethod.GRACEFUL)
        await ssh.close()

    asyncio.run(scenario())


def test_a_refused_shutdown_names_the_device_and_its_reason(sshd: Sshd, tmp_path: Path) -> None:
    device = Device(tmp_path)
    res = nas(shutdown=f"{device.script} refuse")

    async def scenario() -> None:
        ssh = platform(sshd)
        [target] = await ssh.resolve(res)
        try:
            await ssh.stop(target, StopMethod.GRACEFUL)
        finally:
            await ssh.close()

    with pytest.raises(PermanentError) as err:
        asyncio.run(scenario())
    assert str(err.value) == (
        "resource 'nas01': shutdown command on 127.0.0.1 exited 4: "
        "shutdown refused: volume resync in progress"
    )


def test_an_unverified_host_key_is_refused_and_nothing_runs(sshd: Sshd, tmp_path: Path) -> None:
    device = Device(tmp_path)
    res = nas(shutdown=f"{device.script} shutdown")

    async def scenario() -> None:
        ssh = platform(sshd, known_hosts=str(sshd.wrong_known_hosts))
        [target] = await ssh.resolve(res)
        try:
            await ssh.stop(target, StopMethod.GRACEFUL)
        finally:
            await ssh.close()

    with pytest.raises(PermanentError, match="host key does not match"):
        asyncio.run(scenario())
    assert device.actions() == []


def test_without_status_the_ssh_port_says_up_and_silence_is_unknown(sshd: Sshd) -> None:
    """A closed port is what an off NAS looks like, and also a wrong address: unknown, never
    off, until the device accepted its shutdown (tests/unit/test_unreachable_devices.py)."""

    async def state(port: int) -> PowerState:
        ssh = platform(sshd, port=port)
        [target] = await ssh.resolve(nas(shutdown="true"))
        answer: PowerState = await ssh.power_state(target)
        return answer

    assert asyncio.run(state(sshd.port)) is PowerState.ON
    assert asyncio.run(state(free_port())) is PowerState.UNKNOWN


@pytest.mark.parametrize(
    "status", ["kill -KILL $$", "kill -KILL $PPID"], ids=["killed", "session-dropped"]
)
def test_a_status_that_ends_without_an_exit_status_is_unknown_not_off(
    sshd: Sshd, status: str
) -> None:
    """A status command killed on the device, or a session closed before it said anything
    (a switch CLI that never sends an exit status), says nothing of the device: unknown,
    never off before it accepted its shutdown, so the step still sends the shutdown."""

    async def state() -> PowerState:
        ssh = platform(sshd)
        [target] = await ssh.resolve(nas(shutdown="true", status=status))
        answer: PowerState = await ssh.power_state(target)
        await ssh.close()
        return answer

    assert asyncio.run(state()) is PowerState.UNKNOWN


def test_startup_command_and_no_power_on_without_one(sshd: Sshd, tmp_path: Path) -> None:
    device = Device(tmp_path)
    (tmp_path / "state").write_text("off\n")
    res = nas(startup=f"{device.script} startup", status=f"{device.script} status")

    async def scenario(resource: ResourceConfig) -> bool:
        ssh = platform(sshd)
        [target] = await ssh.resolve(resource)
        try:
            await ssh.start(target)
            return bool(await ssh.wait_for(target, PowerState.ON, 5))
        finally:
            await ssh.close()

    assert asyncio.run(scenario(res)) is True
    with pytest.raises(PermanentError, match="set power_on_via"):
        asyncio.run(scenario(nas(shutdown="true")))


def test_command_lines_reach_switch_clis_unchanged() -> None:
    assert command_argv("shutdown -h now") == ["shutdown", "-h", "now"]
    assert command_argv("write memory") == ["write", "memory"]
    assert command_argv("sync; poweroff") == ["sh", "-c", "sync; poweroff"]


SLOW_STOP = """#!/bin/sh
# slow-stop: logs when it begins, runs until the test releases it, then logs its end
dir=$(dirname "$0")
echo "begin $$" >> "$dir/runs.log"
while [ ! -e "$dir/release" ]; do sleep 0.05; done
echo "end $$" >> "$dir/runs.log"
"""


def slow_device(base: Path) -> Path:
    script = base / "slow-stop"
    script.write_text(SLOW_STOP)
    script.chmod(0o755)
    return script


def begun(base: Path) -> list[str]:
    log = base / "runs.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith("begin ")]


def run_then_unlock(scenario: Coroutine[Any, Any, None], rid: str) -> None:
    """Run ``scenario``, then remove the ``once`` lock file it left in this machine's home."""
    try:
        asyncio.run(scenario)
    finally:
        (Path.home() / f".upsguard-{rid}-shutdown.lock").unlink(missing_ok=True)


@pytest.mark.parametrize(("once", "starts"), [(True, 1), (False, 2)])
def test_once_refuses_a_second_copy_while_the_first_runs_on_the_device(
    sshd: Sshd, tmp_path: Path, once: bool, starts: int
) -> None:
    """Two controllers (a restarted one, say) send the same shutdown while the first copy
    still runs: with ``once`` the second is refused by ``flock`` beside the first and taken
    as that request under way; without it the command runs twice."""
    script = slow_device(tmp_path)
    rid = lock_of_its_own()
    res = nas(id=rid, shutdown=str(script), ssh={"once": once} if once else None)

    async def scenario() -> None:
        first, second = platform(sshd), platform(sshd)
        [target] = await first.resolve(res)
        await second.resolve(res)
        running = asyncio.create_task(first.stop(target, StopMethod.GRACEFUL))
        while not begun(tmp_path):  # the first copy runs on the device, until released
            await asyncio.sleep(0.05)
        again = asyncio.create_task(second.stop(target, StopMethod.GRACEFUL))
        while not again.done() and len(begun(tmp_path)) < 2:  # refused, or running too
            await asyncio.sleep(0.05)
        (tmp_path / "release").touch()
        await asyncio.gather(running, again)
        await first.close()
        await second.close()

    run_then_unlock(scenario(), rid)
    assert len(begun(tmp_path)) == starts


@pytest.mark.parametrize(
    ("second_request", "starts"), [("run-1.stop:nas", 1), ("run-2.stop:nas", 2)]
)
def test_once_refuses_a_copy_for_the_same_request_after_the_first_ended(
    sshd: Sshd, tmp_path: Path, second_request: str, starts: int
) -> None:
    """A restarted controller read the device up while the first copy still ran, and sent
    its copy as the first ended (a loaded machine's full lane saw the command begin twice):
    the same request's copy is refused even with the first copy gone; another request's
    (the next outage's) runs."""
    script = slow_device(tmp_path)
    (tmp_path / "release").touch()  # each copy ends at once
    rid = lock_of_its_own()
    res = nas(id=rid, shutdown=str(script), ssh={"once": True})

    async def scenario() -> None:
        first, second = platform(sshd), platform(sshd)
        [target] = await first.resolve(res)
        await second.resolve(res)
        await first.send_command(target, PowerState.OFF, lambda: None, request="run-1.stop:nas")
        await second.send_command(target, PowerState.OFF, lambda: None, request=second_request)
        await first.close()
        await second.close()

    run_then_unlock(scenario(), rid)
    assert len(begun(tmp_path)) == starts


def test_a_once_command_that_fails_says_why(sshd: Sshd, tmp_path: Path) -> None:
    device = Device(tmp_path)
    rid = lock_of_its_own()
    res = nas(id=rid, shutdown=f"{device.script} refuse", ssh={"once": True})

    async def scenario() -> None:
        ssh = platform(sshd)
        [target] = await ssh.resolve(res)
        try:
            await ssh.stop(target, StopMethod.GRACEFUL)
        finally:
            await ssh.close()

    try:
        with pytest.raises(PermanentError) as err:
            asyncio.run(scenario())
    finally:
        (Path.home() / f".upsguard-{rid}-shutdown.lock").unlink(missing_ok=True)
    assert str(err.value) == (
        f"resource '{rid}': shutdown command on 127.0.0.1 exited 4: "
        "shutdown refused: volume resync in progress"
    )


def test_a_command_is_heard_as_sent_only_once_the_device_answered(
    sshd: Sshd, tmp_path: Path
) -> None:
    device = Device(tmp_path)
    res = nas(shutdown=f"{device.script} shutdown", status=f"{device.script} status")
    heard: list[str] = []

    async def scenario(ssh: Any) -> None:
        [target] = await ssh.resolve(res)
        try:
            await ssh.send_command(
                target, PowerState.OFF, lambda: heard.append("sent"), request="run.stop:nas"
            )
        finally:
            await ssh.close()

    with pytest.raises(PlatformUnreachable):
        asyncio.run(scenario(platform(sshd, port=free_port())))
    assert (heard, device.actions()) == ([], [])
    asyncio.run(scenario(platform(sshd)))
    assert (heard, device.actions()) == (["sent"], ["shutdown"])


def test_doctor_checks_that_once_can_guard_the_commands_on_the_device(sshd: Sshd) -> None:
    plain = nas(id="nas-plain", shutdown="poweroff")
    guarded = nas(id="nas-once", shutdown="poweroff", ssh={"once": True})

    async def scenario() -> list[tuple[str, str, str]]:
        ssh = platform(sshd)
        try:
            found = await ssh.diagnose([plain, guarded])
        finally:
            await ssh.close()
        return [(f.subject, f.check, f.verdict.value) for f in found]

    assert asyncio.run(scenario()) == [
        ("nas-plain", "ssh", "ok"),
        ("nas-once", "ssh", "ok"),
        ("nas-once", "once", "ok"),
    ]
