"""lvmcache provider against fake ``lvs``/``lvchange`` that print lvm2's formats and drain."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import LvmcacheSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.lvmcache import LvmcacheProvider

CHUNK = 64 * 1024


def lv(vg: str, name: str, dirty: int, rate: float = 2000.0, **extra: object) -> dict[str, object]:
    return {
        "kind": "lvmcache", "vg": vg, "lv": name, "mode": "writeback", "policy": "smq",
        "chunk_size": CHUNK, "total_blocks": 16384, "used_blocks": 9000, "dirty": dirty,
        "rate": rate, "draining": False, "accepting": True, **extra,
    }  # fmt: skip


@pytest.fixture
def tools(tmp_path: Path) -> FakeTools:
    return FakeTools(
        tmp_path / "bin",
        {
            "vg0/data": lv("vg0", "data", dirty=1500),
            "vg0/logs": lv("vg0", "logs", dirty=0, mode="writethrough", accepting=False),
        },
    )


def provider(tools: FakeTools, tmp_path: Path, **extra: object) -> LvmcacheProvider:
    settings = LvmcacheSettings.model_validate(
        {
            "name": "dmcache",
            "provider": "lvmcache",
            "lvs_command": tools.path("lvs"),
            "lvchange_command": tools.path("lvchange"),
            "job_log_dir": str(tmp_path),
            **extra,
        }
    )
    return LvmcacheProvider(settings, SystemClock())


def target(name: str = "vg0/data") -> CacheTarget:
    return CacheTarget(CacheName("dmcache"), name)


async def poll_until_clean(p: LvmcacheProvider, limit: float) -> list[CacheState]:
    seen: list[CacheState] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        seen.append(await p.read(target()))
        if seen[-1].clean:
            break
        await asyncio.sleep(0.1)
    return seen


def test_lists_cached_lvs_and_reads_dirty_bytes(tools: FakeTools, tmp_path: Path) -> None:
    p = provider(tools, tmp_path)

    async def scenario() -> tuple[list[CacheTarget], CacheState]:
        return await p.targets(), await p.read(target())

    found, state = asyncio.run(scenario())
    assert [t.name for t in found] == ["vg0/data", "vg0/logs"]
    assert state.mode is CacheMode.WRITE_BACK and not state.clean
    assert state.dirty_bytes == 1500 * CHUNK
    assert state.detail == "policy smq"


def test_write_through_returns_at_once_and_reports_the_flush(
    tools: FakeTools, tmp_path: Path
) -> None:
    p = provider(tools, tmp_path)

    async def scenario() -> list[CacheState]:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        seen = await poll_until_clean(p, limit=30)
        # clean can show in lvs a moment before the detached lvchange has written its end
        deadline = time.monotonic() + 10
        while "lvchange done" not in seen[-1].detail and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            seen.append(await p.read(target()))
        return seen

    seen = asyncio.run(scenario())
    assert any("lvchange flushing:" in s.detail and "blocks left" in s.detail for s in seen)
    assert any(s.detail.startswith("policy cleaner") for s in seen)
    dirty = [s.dirty_bytes or 0 for s in seen]
    assert dirty == sorted(dirty, reverse=True) and dirty[0] > 0
    assert seen[-1].clean and seen[-1].mode is CacheMode.WRITE_THROUGH
    assert seen[-1].detail == "policy smq; lvchange done"
    assert tools.device("vg0/data")["mode"] == "writethrough"


def test_write_back_during_the_flush_aborts_it_and_restores_the_mode(
    tools: FakeTools, tmp_path: Path
) -> None:
    data = tools.read()
    data["devices"]["vg0/data"]["rate"] = 50.0  # slow: still flushing when we switch back
    tools.write(data)
    p = provider(tools, tmp_path)

    async def scenario() -> CacheState:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        await asyncio.sleep(0.8)
        await p.set_mode(target(), CacheMode.WRITE_BACK)
        return await p.read(target())

    state = asyncio.run(scenario())
    assert state.mode is CacheMode.WRITE_BACK and not state.clean
    assert state.detail == "policy smq"
    assert tools.device("vg0/data")["policy"] == "smq"


def test_unknown_lv_is_a_permanent_error_naming_it(tools: FakeTools, tmp_path: Path) -> None:
    p = provider(tools, tmp_path)
    with pytest.raises(PermanentError, match=r'Failed to find logical volume "vg0/nope"'):
        asyncio.run(p.read(target("vg0/nope")))
