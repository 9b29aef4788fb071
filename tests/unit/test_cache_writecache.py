"""dm-writecache provider against a fake ``dmsetup`` printing the kernel's status and table."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import WritecacheSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.writecache import WritecacheProvider, dm_name, parse_status

BLOCK = 4096


def wc(dm: str, dirty: int, **extra: object) -> dict[str, object]:
    return {
        "kind": "writecache", "vg": "vg0", "lv": dm.split("-", 1)[1], "dm_name": dm,
        "total_blocks": 262144, "block_size": BLOCK, "length": 41943040,
        "origin": "253:1", "cache": "253:2", "options": ["high_watermark", "50"],
        "dirty": dirty, "rate": 20000.0, "draining": False, "accepting": True, **extra,
    }  # fmt: skip


@pytest.fixture
def tools(tmp_path: Path) -> FakeTools:
    return FakeTools(tmp_path / "bin", {"a": wc("vg0-fast", 60000), "b": wc("vg0-idle", 0)})


def provider(tools: FakeTools) -> WritecacheProvider:
    settings = WritecacheSettings.model_validate(
        {"name": "pmem", "provider": "writecache", "dmsetup_command": tools.path("dmsetup")}
    )
    return WritecacheProvider(settings, SystemClock())


def target(name: str = "vg0/fast") -> CacheTarget:
    return CacheTarget(CacheName("pmem"), name)


def test_status_line_and_lvm_names() -> None:
    line = "0 41943040 writecache 0 262144 202144 64 1200 300 50000 10 5 0 49985 0 812 0"
    assert parse_status(line) == (0, 262144, 202144, 64)
    assert dm_name("vg-a/lv-b") == "vg--a-lv--b"


def test_reads_every_cached_block_as_dirty(tools: FakeTools) -> None:
    p = provider(tools)

    async def scenario() -> tuple[list[CacheTarget], CacheState]:
        return await p.targets(), await p.read(target())

    found, state = asyncio.run(scenario())
    assert [t.name for t in found] == ["vg0-fast", "vg0-idle"]
    assert state.mode is CacheMode.WRITE_BACK and not state.clean
    assert state.dirty_bytes == 60000 * BLOCK
    assert state.detail == "60000 of 262144 blocks cached, 0 under writeback"


def test_an_empty_cache_in_write_back_mode_is_not_clean(tools: FakeTools) -> None:
    state = asyncio.run(provider(tools).read(target("vg0-idle")))
    assert state.dirty_bytes == 0 and not state.clean


def test_write_through_means_cleaner_until_empty_and_write_back_reloads(
    tools: FakeTools,
) -> None:
    p = provider(tools)

    async def scenario() -> tuple[list[CacheState], CacheState]:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        seen = [await p.read(target())]
        deadline = time.monotonic() + 30
        while not seen[-1].clean and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            seen.append(await p.read(target()))
        await p.flush(target())
        await p.set_mode(target(), CacheMode.WRITE_BACK)
        return seen, await p.read(target())

    seen, after = asyncio.run(scenario())
    assert seen[0].mode is CacheMode.CLEANER and not seen[0].clean
    assert seen[-1].clean and seen[-1].dirty_bytes == 0
    assert len(seen) > 2  # it drained over time, not at once
    assert after.mode is CacheMode.WRITE_BACK
    assert tools.device("a")["options"] == ["high_watermark", "50"]


def test_unknown_device_names_it(tools: FakeTools) -> None:
    with pytest.raises(PermanentError, match=r"cache 'pmem' nope: dmsetup status: Device nope"):
        asyncio.run(provider(tools).read(target("nope")))
