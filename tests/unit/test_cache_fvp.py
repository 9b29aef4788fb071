"""FVP provider against a fake ``pwsh`` running the FVP cmdlets on fake VMs that destage."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import FvpSettings
from upsguard.errors import AuthenticationError, PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.fvp import FvpProvider


def vm(name: str, dirty: float, peers: int, ext: int) -> dict[str, object]:
    return {
        "kind": "fvp", "vm": name, "policy": "WriteBack", "peers": peers, "ext_peers": ext,
        "dirty": dirty, "rate": 1000.0, "draining": False, "accepting": True,
    }  # fmt: skip


@pytest.fixture
def tools(tmp_path: Path) -> FakeTools:
    devices = {"a": vm("sql01", 2500, 2, 1), "b": vm("app01", 0, 1, 0)}
    fake = FakeTools(tmp_path / "bin", devices, clock=0.0)
    data = fake.read()
    data["password"] = "s3cret"
    fake.write(data)
    (tmp_path / "fvp.pw").write_text("s3cret\n")
    return fake


def provider(tools: FakeTools, tmp_path: Path, password: str = "fvp.pw") -> FvpProvider:
    settings = FvpSettings.model_validate(
        {
            "name": "esx01-flash",
            "provider": "fvp",
            "pwsh_command": tools.path("pwsh"),
            "fvp_server": "fvp01.lab",
            "user": "upsguard",
            "password_file": str(tmp_path / password),
            "state_dir": str(tmp_path / "state"),
        }
    )
    return FvpProvider(settings, SystemClock())


def target(name: str = "sql01") -> CacheTarget:
    return CacheTarget(CacheName("esx01-flash"), name)


def test_lists_vms_and_reads_effective_policy(tools: FakeTools, tmp_path: Path) -> None:
    p = provider(tools, tmp_path)

    async def scenario() -> tuple[list[CacheTarget], CacheState]:
        return await p.targets(), await p.read(target())

    found, state = asyncio.run(scenario())
    assert [t.name for t in found] == ["sql01", "app01"]
    assert state.mode is CacheMode.WRITE_BACK and state.dirty_bytes is None
    assert not state.clean and state.detail == "effective policy WriteBack, time to destage 3s"


def test_write_through_is_clean_only_once_destaged_and_write_back_restores_peers(
    tools: FakeTools, tmp_path: Path
) -> None:
    p = provider(tools, tmp_path)

    async def scenario() -> list[CacheState]:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        seen = [await p.read(target())]
        tools.advance(2.0)  # 1,000 a second of 2,500
        seen.append(await p.read(target()))
        tools.advance(1.0)
        seen.append(await p.read(target()))
        return seen

    destaging, nearly, done = asyncio.run(scenario())
    assert destaging.mode is CacheMode.WRITE_BACK and not destaging.clean
    assert destaging.detail == "effective policy WriteBack, time to destage 3s"
    assert nearly.detail == "effective policy WriteBack, time to destage 1s" and not nearly.clean
    assert done.clean and done.mode is CacheMode.WRITE_THROUGH
    assert done.detail == "effective policy WriteThrough, time to destage 0s"
    later = provider(tools, tmp_path)  # another process restores the peers it saved
    asyncio.run(later.set_mode(target(), CacheMode.WRITE_BACK))
    device = tools.device("a")
    assert (device["policy"], device["peers"], device["ext_peers"]) == ("WriteBack", 2, 1)


def test_a_wrong_password_is_an_authentication_error_without_the_secret(
    tools: FakeTools, tmp_path: Path
) -> None:
    (tmp_path / "wrong.pw").write_text("nope\n")
    with pytest.raises(AuthenticationError, match="Authentication failed") as caught:
        asyncio.run(provider(tools, tmp_path, "wrong.pw").read(target()))
    assert "nope" not in str(caught.value) and "s3cret" not in str(caught.value)


def test_unknown_vm_is_named(tools: FakeTools, tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match=r"Object 'web99' was not found"):
        asyncio.run(provider(tools, tmp_path).read(target("web99")))
