"""storcli provider against a fake ``storcli64`` printing its ``J`` JSON answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import StorcliSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.storcli import StorcliProvider, write_policy


def vd(number: int, cache: str, dirty: float = 0.0) -> dict[str, object]:
    return {
        "kind": "storcli", "dg": number, "vd": number, "cache": cache, "name": f"vd{number}",
        "dirty": dirty, "rate": 4000.0, "draining": False, "accepting": "WT" not in cache,
    }  # fmt: skip


def make(tmp_path: Path, flush_fails: bool = False) -> tuple[FakeTools, StorcliProvider]:
    tools = FakeTools(tmp_path / "bin", {"0": vd(0, "RWBD", 2000), "1": vd(1, "RAWBD", 1000)})
    if flush_fails:
        data = tools.read()
        data["flush_fails"] = True
        tools.write(data)
    settings = StorcliSettings.model_validate(
        {"name": "perc", "provider": "storcli", "storcli_command": tools.path("storcli64")}
    )
    return tools, StorcliProvider(settings, SystemClock())


def target(name: str) -> CacheTarget:
    return CacheTarget(CacheName("perc"), name)


def test_write_policy_of_the_cache_field() -> None:
    assert [write_policy(c) for c in ("RWBD", "RAWBD", "NRWTD", "NRWTC")] == [
        "WB",
        "AWB",
        "WT",
        "WT",
    ]


def test_lists_drives_and_has_no_dirty_counter(tmp_path: Path) -> None:
    _, p = make(tmp_path)

    async def scenario() -> tuple[list[CacheTarget], CacheState]:
        return await p.targets(), await p.read(target("v0"))

    found, state = asyncio.run(scenario())
    assert [t.name for t in found] == ["v0", "v1"]
    assert state.mode is CacheMode.WRITE_BACK and state.dirty_bytes is None and not state.clean
    assert state.detail == "cache policy RWBD, state Optl"


def test_clean_means_wt_and_a_successful_flush_and_write_back_is_restored_exactly(
    tmp_path: Path,
) -> None:
    tools, p = make(tmp_path)

    async def scenario() -> tuple[CacheState, CacheState]:
        for name in ("v0", "v1"):
            await p.set_mode(target(name), CacheMode.WRITE_THROUGH)
        after = await p.read(target("v1"))
        again = await p.read(target("v1"))
        for name in ("v0", "v1"):
            await p.set_mode(target(name), CacheMode.WRITE_BACK)
        return after, again

    after, again = asyncio.run(scenario())
    assert after.clean and after.detail.endswith("; controller cache flushed")
    assert again.clean
    assert tools.device("1")["dirty"] == 0
    assert [tools.device(n)["cache"] for n in ("0", "1")] == ["RWBD", "RAWBD"]


def test_a_failed_flush_is_not_clean_and_says_why(tmp_path: Path) -> None:
    _, p = make(tmp_path, flush_fails=True)

    async def scenario() -> CacheState:
        await p.set_mode(target("v0"), CacheMode.WRITE_THROUGH)
        return await p.read(target("v0"))

    state = asyncio.run(scenario())
    assert state.mode is CacheMode.WRITE_THROUGH and not state.clean
    assert "flush failed: cache 'perc' /c0 flushcache: Flush cache failed" in state.detail


def test_missing_drive_is_named(tmp_path: Path) -> None:
    _, p = make(tmp_path)
    with pytest.raises(PermanentError, match=r"/c0/v7 show: Virtual drive 7 doesn't exist"):
        asyncio.run(p.read(target("v7")))
