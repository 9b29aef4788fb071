"""bcache provider against a copy of the sysfs files the kernel printed in the QEMU guest.

The copy does not drain: a test writes what the kernel would print next. What the kernel
does during a destage is tested against the real kernel in tests/integration/test_guest_*.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.caches.bcache_sysfs import MODES, BcacheSysfs
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
def sysfs(tmp_path: Path) -> BcacheSysfs:
    clean = {"cache_mode": MODES["writethrough"], "state": "clean", "dirty_data": "0.0k"}
    # bcache0: 300 MiB dirty, write-back, the kernel's defaults
    return BcacheSysfs(tmp_path / "sys", {"bcache0": {}, "bcache1": clean})


def target(name: str = "bcache0") -> CacheTarget:
    return CacheTarget(CacheName("ssd"), name)


def read(provider: BcacheProvider, name: str = "bcache0") -> CacheState:
    return asyncio.run(provider.read(target(name)))


def test_parses_the_kernel_formats() -> None:
    assert parse_cache_mode("writethrough [writeback] writearound none") is CacheMode.WRITE_BACK
    assert parse_cache_mode("[writethrough] writeback writearound none") is CacheMode.WRITE_THROUGH
    assert parse_hprint("0.0k") == 0
    assert parse_hprint("1.5M") == int(1.5 * MiB)
    assert parse_hprint("2.0G") == 2 * 1024**3


def test_lists_devices_and_reads_mode_dirty_and_state(tmp_path: Path, sysfs: BcacheSysfs) -> None:
    provider = BcacheProvider(settings(tmp_path), SystemClock())
    found = asyncio.run(provider.targets())
    assert [t.name for t in found] == ["bcache0", "bcache1"]
    dirty, clean = read(provider), read(provider, "bcache1")
    assert dirty.mode is CacheMode.WRITE_BACK and not dirty.clean
    assert dirty.dirty_bytes == 300 * MiB and dirty.detail == "state dirty"
    assert clean.mode is CacheMode.WRITE_THROUGH and clean.clean and clean.dirty_bytes == 0


def test_write_through_sets_full_speed_then_restores_user_settings_once_clean(
    tmp_path: Path, sysfs: BcacheSysfs
) -> None:
    provider = BcacheProvider(settings(tmp_path), SystemClock())
    asyncio.run(provider.set_mode(target(), CacheMode.WRITE_THROUGH))
    assert sysfs.mode("bcache0") == MODES["writethrough"]
    knobs = ("writeback_percent", "writeback_delay", "writeback_running")
    assert [sysfs.attr("bcache0", knob) for knob in knobs] == ["0", "0", "1"]
    assert "destaging at full speed" in read(provider).detail
    sysfs.drained("bcache0")
    assert read(provider).clean
    assert [sysfs.attr("bcache0", knob) for knob in knobs] == ["10", "30", "1"]


def test_set_write_through_twice_keeps_the_users_values(tmp_path: Path, sysfs: BcacheSysfs) -> None:
    sysfs.set("bcache0", "writeback_percent", "25")
    provider = BcacheProvider(settings(tmp_path), SystemClock())

    async def scenario() -> None:
        await provider.set_mode(target(), CacheMode.WRITE_THROUGH)
        await provider.set_mode(target(), CacheMode.WRITE_THROUGH)
        await provider.set_mode(target(), CacheMode.WRITE_BACK)

    asyncio.run(scenario())
    assert sysfs.attr("bcache0", "writeback_percent") == "25"
    assert sysfs.mode("bcache0") == MODES["writeback"]


def test_another_process_restores_the_saved_settings_once_clean(
    tmp_path: Path, sysfs: BcacheSysfs
) -> None:
    """`cache set write-through` exits; a later `cache wait` finds the saved values."""
    asyncio.run(
        BcacheProvider(settings(tmp_path), SystemClock()).set_mode(
            target(), CacheMode.WRITE_THROUGH
        )
    )
    sysfs.drained("bcache0")
    later = BcacheProvider(settings(tmp_path), SystemClock())
    assert read(later).clean
    assert sysfs.attr("bcache0", "writeback_percent") == "10"
    assert not (tmp_path / "state" / "ssd.bcache.json").read_text().count("bcache0")


def test_missing_device_is_a_permanent_error_naming_it(tmp_path: Path, sysfs: BcacheSysfs) -> None:
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
    BcacheSysfs(
        tmp_path / "sys",
        {"bcache0": {"cache_mode": MODES["writethrough"], "state": "clean", "dirty_data": "4.5M"}},
    )
    state = read(BcacheProvider(settings(tmp_path), SystemClock()))
    assert state.dirty_bytes == round(4.5 * MiB)
    assert not state.clean
