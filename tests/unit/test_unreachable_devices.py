"""A device that does not answer is unknown, never off: the drill, doctor and a shutdown step
over SSH must not take "cannot connect" for "already off" (the homelab example's NAS units,
addressed by DNS names whose servers the plan stops first, would be skipped, never shut down).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from tests.peers.ports import free_port
from upsguard.cli import main
from upsguard.clock import LoopClock, SystemClock
from upsguard.config.platforms import SshSettings
from upsguard.config.resources import ResourceConfig
from upsguard.engine.actions import StepRunner, UnderWay
from upsguard.models import (
    Direction,
    PlatformName,
    PowerState,
    ResourceKind,
    RunId,
    StepId,
    StepState,
    Target,
)
from upsguard.plugins.platforms.base import SeenWhileItAnswers
from upsguard.plugins.platforms.ssh import SshPlatform
from upsguard.runbooks.plan import Action, Step, StepSettings


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    return key


def nas(**fields: object) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": "nas01", "kind": "storage", "platform": "nasssh", "host": "127.0.0.1", **fields}
    )


def ssh_platform(key_file: Path, port: int) -> SshPlatform:
    settings = SshSettings.model_validate(
        {"type": "ssh", "user": "root", "key_file": str(key_file), "port": port, "timeout": "2s"}
    )
    return SshPlatform(PlatformName("nasssh"), settings, SystemClock())


@pytest.mark.parametrize("status", [None, "true"], ids=["port", "status command"])
def test_a_device_that_does_not_answer_reads_unknown_until_it_accepted_its_shutdown(
    key_file: Path, status: str | None
) -> None:
    platform = ssh_platform(key_file, free_port())
    res = nas(shutdown="poweroff", status=status)

    async def states() -> tuple[PowerState, PowerState]:
        [target] = await platform.resolve(res)
        before = await platform.power_state(target)
        platform.shutdown_accepted(target)
        return before, await platform.power_state(target)

    assert isinstance(platform, SeenWhileItAnswers)
    assert asyncio.run(states()) == (PowerState.UNKNOWN, PowerState.OFF)


def step_of(res: ResourceConfig) -> Step:
    settings = StepSettings(
        resource=res, timeout_s=5.0, retries=0, fallback="fail", fallback_without_graceful="fail"
    )
    return Step(
        id=StepId(f"stop:{res.id}"),
        resource=res.id,
        kind=res.kind,
        platform="nasssh",
        action=Action.DEVICE_SHUTDOWN,
        waits_for=(),
        estimate_s=5.0,
        description="stop nas01",
        settings=settings,
    )


def test_a_shutdown_step_on_a_device_out_of_reach_fails_and_says_why(key_file: Path) -> None:
    """It was done, "nas01 already off", and the NAS never shut down."""
    platform = ssh_platform(key_file, free_port())
    res = nas(shutdown="poweroff")

    async def outcome() -> tuple[StepState, str]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        runner = StepRunner(
            {platform.name: platform}, clock, Direction.SHUTDOWN, {}, run=RunId("r1")
        )
        done = await runner.run(step_of(res), clock.now())
        return done.state, done.detail

    state, detail = asyncio.run(outcome())
    assert state is StepState.FAILED and "already off" not in detail
    assert "cannot connect" in detail


def test_a_shutdown_accepted_before_a_restart_lands_when_the_device_goes_quiet(
    key_file: Path,
) -> None:
    """The resumed run's platform never sent that shutdown itself: the journal's request
    tells it, and the device's silence is then the shutdown landing, not a failure."""
    platform = ssh_platform(key_file, free_port())
    res = nas(shutdown="poweroff")
    target = Target(platform.name, ResourceKind.STORAGE, "127.0.0.1", ref="nas01")
    earlier = UnderWay(RunId("r0"), StepId("stop:nas01"), target, PowerState.OFF, True)

    async def outcome() -> tuple[StepState, str]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        runner = StepRunner(
            {platform.name: platform},
            clock,
            Direction.SHUTDOWN,
            {},
            resumed=True,
            run=RunId("r1"),
            under_way={(platform.name, "127.0.0.1"): earlier},
        )
        done = await runner.run(step_of(res), clock.now())
        return done.state, done.detail

    assert asyncio.run(outcome()) == (StepState.DONE, "127.0.0.1 already off")


def site_with_unreachable_nas(tmp_path: Path, key_file: Path) -> Path:
    site = {
        "site": "t",
        "ups": [{"name": "u", "simulated": {}}],
        "platforms": {
            "nasssh": {
                "type": "ssh",
                "user": "root",
                "key_file": str(key_file),
                "port": free_port(),
                "timeout": "2s",
            }
        },
        "resources": [
            {
                "id": "nas01",
                "kind": "storage",
                "platform": "nasssh",
                "host": "127.0.0.1",
                "shutdown": "poweroff",
            }
        ],
        "journal": str(tmp_path / "journal.sqlite"),
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def test_drill_never_says_already_off_for_a_device_it_cannot_reach(
    tmp_path: Path, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = site_with_unreachable_nas(tmp_path, key_file)
    code = main(["drill", "-c", str(path), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    [step] = [s for s in report["steps"] if s["step"] == "stop:nas01"]
    assert code == 1
    assert step["would"] == "fail" and step["states"] == ["unknown"]
    assert step["detail"].startswith("the state of 127.0.0.1 cannot be read: ")
    assert "cannot connect" in step["detail"]


def test_doctor_never_says_ok_for_a_state_it_could_not_read(
    tmp_path: Path, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = site_with_unreachable_nas(tmp_path, key_file)
    code = main(["doctor", "-c", str(path), "--format", "json", "--only", "nas01"])
    rows = json.loads(capsys.readouterr().out)["findings"]
    [state] = [r for r in rows if r["subject"] == "nas01" and r["check"] == "state"]
    assert code == 1
    assert state["verdict"] == "fail" and state["detail"] == "cannot be read: 127.0.0.1: unknown"
