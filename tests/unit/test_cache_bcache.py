"""bcache provider against a copy of the sysfs tree that drains like the kernel does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.caches.fake_bcache import Device, FakeBcacheSysfs
from upsguard.clock import SystemClock
from upsguard.config.caches import BcacheSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.bcache import BcacheProvider, parse_cache_mode, parse_hprint

MiB = 1024 * 1024


def settings(tmp_path: Path, **extra: object) -> BcacheSettings:
    return BcacheSettings.model_validate(
        {
            "name": "ssd",
            "provider": "bcache",
            "sysfs_root": str(tmp_path / "sys"),
            "state_dir": str(tmp_path / "state"),
            **extra,
        }
    )


@pytest.fixture
def sysfs(tmp_path: Path) -> Iterator[FakeBcacheSysfs]:
    # 300 MiB dirty is below the 10 % target of a 10 GiB cache: the idle trickle.
    devices = {
        "bcache0": Device(dirty=300 * MiB, full_rate=1000 * MiB),
        "bcache1": Device(dirty=0, mode="writethrough"),
    }
    with FakeBcacheSysfs(tmp_path / "sys", devices) as fake:
        yield fake


def target(name: str = "bcache0") -> CacheTarget:
    return CacheTarget(CacheName("ssd"), name)


async def wait_clean(provider: BcacheProvider, tgt: CacheTarget, limit: float) -> CacheState:
    """Poll like the destage watch does; give up after ``limit`` seconds of wall time."""
    deadline = time.monotonic() + limit
    while True:
        state = await provider.read(tgt)
        if state.clean or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.05)


def test_parses_the_kernel_formats() -> None:
    assert parse_cache_mode("writethrough [writeback] writearound none") is CacheMode.WRITE_BACK
    assert parse_cache_mode("[writethrough] writeback writearound none") is CacheMode.WRITE_THROUGH
    assert parse_hprint("0.0k") == 0
    assert parse_hprint("1.5M") == int(1.5 * MiB)
    assert parse_hprint("2.0G") == 2 * 1024**3


def test_lists_devices_and_reads_mode_dirty_and_state(
    tmp_path: Path, sysfs: FakeBcacheSysfs
) -> None:
    provider = BcacheProvider(settings(tmp_path), SystemClock())

    async def scenario() -> tuple[list[CacheTarget], CacheState, CacheState]:
        found = await provider.targets()
        return found, await provider.read(found[0]), await provider.read(found[1])

    found, dirty, clean = asyncio.run(scenario())
    assert [t.name for t in found] == ["bcache0", "bcache1"]
    assert dirty.mode is CacheMode.WRITE_BACK and not dirty.clean
    assert 299 * MiB <= (dirty.dirty_bytes or 0) <= 300 * MiB
    assert clean.mode is CacheMode.WRITE_THROUGH and clean.clean and clean.dirty_bytes == 0


def test_plain_writethrough_switch_leaves_data_trickling(tmp_path: Path) -> None:
    """The trap the provider exists for: mode alone does not hurry the destage."""
    with FakeBcacheSysfs(tmp_path / "sys", {"bcache0": Device(dirty=300 * MiB)}) as fake:
        (fake.dir("bcache0") / "cache_mode").write_text("writethrough\n")
        time.sleep(0.5)
        assert fake.attr("bcache0", "state") == "dirty"
        assert fake.attr("bcache0", "writeback_rate") == "4.0k"


def test_write_through_destages_at_full_speed_then_restores_user_settings(
    tmp_path: Path, sysfs: FakeBcacheSysfs
) -> None:
    provider = BcacheProvider(settings(tmp_path), SystemClock())

    async def scenario() -> CacheState:
        await provider.set_mode(target(), CacheMode.WRITE_THROUGH)
        assert sysfs.attr("bcache0", "writeback_percent") == "0"
        assert sysfs.attr("bcache0", "writeback_delay") == "0"
        return await wait_clean(provider, target(), limit=30)

    final = asyncio.run(scenario())
    assert final.clean and final.dirty_bytes == 0
    assert final.mode is CacheMode.WRITE_THROUGH
    assert sysfs.attr("bcache0", "cache_mode") == "[writethrough] writeback writearound none"
    assert sysfs.attr("bcache0", "writeback_percent") == "10"
    assert sysfs.attr("bcache0", "writeback_delay") == "30"


def test_set_write_through_twice_keeps_the_users_values(
    tmp_path: Path, sysfs: FakeBcacheSysfs
) -> None:
    (sysfs.dir("bcache0") / "writeback_percent").write_text("25\n")
    provider = BcacheProvider(settings(tmp_path), SystemClock())

    async def scenario() -> None:
        await provider.set_mode(target(), CacheMode.WRITE_THROUGH)
        await provider.set_mode(target(), CacheMode.WRITE_THROUGH)
        await provider.set_mode(target(), CacheMode.WRITE_BACK)

    asyncio.run(scenario())
    assert sysfs.attr("bcache0", "writeback_percent") == "25"
    assert sysfs.attr("bcache0", "cache_mode") == "writethrough [writeback] writearound none"


def test_another_process_restores_the_saved_settings_once_clean(
    tmp_path: Path, sysfs: FakeBcacheSysfs
) -> None:
    """`cache set write-through` exits; a later `cache wait` finds the saved values."""
    asyncio.run(
        BcacheProvider(settings(tmp_path), SystemClock()).set_mode(
            target(), CacheMode.WRITE_THROUGH
        )
    )
    later = BcacheProvider(settings(tmp_path), SystemClock())
    assert asyncio.run(wait_clean(later, target(), limit=30)).clean
    assert sysfs.attr("bcache0", "writeback_percent") == "10"
    assert not (tmp_path / "state" / "ssd.bcache.json").read_text().count("bcache0")


def test_missing_device_is_a_permanent_error_naming_it(
    tmp_path: Path, sysfs: FakeBcacheSysfs
) -> None:
    provider = BcacheProvider(settings(tmp_path, targets=["bcache7"]), SystemClock())
    [missing] = asyncio.run(provider.targets())
    with pytest.raises(PermanentError, match="cache 'ssd' bcache7: not a bcache device"):
        asyncio.run(provider.read(missing))


def test_finding_no_device_is_an_error_not_all_clean(tmp_path: Path) -> None:
    (tmp_path / "sys" / "block").mkdir(parents=True)
    provider = BcacheProvider(settings(tmp_path), SystemClock())
    with pytest.raises(PermanentError, match=r"no bcache device under .*/sys/block: set 'targets'"):
        asyncio.run(provider.targets())


def test_state_clean_with_dirty_data_left_is_not_clean(tmp_path: Path) -> None:
    """The kernel writes ``state`` clean while its last extents are still being written back:
    the guest showed ``dirty_data 4.5M`` with ``state clean``, half a second before ``0.0k``
    (docs/real-kernel-caches.md). Only no dirty data at all is clean."""
    sysfs = tmp_path / "sys" / "block" / "bcache0" / "bcache"
    sysfs.mkdir(parents=True)
    kernel = {
        "cache_mode": "[writethrough] writeback writearound none",
        "state": "clean",
        "dirty_data": "4.5M",
    }
    for attr, value in kernel.items():
        (sysfs / attr).write_text(value + "\n")
    state = asyncio.run(BcacheProvider(settings(tmp_path), SystemClock()).read(target()))
    assert state.dirty_bytes == round(4.5 * MiB)
    assert not state.clean
