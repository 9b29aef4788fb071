"""lvmcache provider: reading what the kernel and lvm2 print.

The lines are copied from the QEMU guest (Debian 12's lvm2 2.03.16, kernel 6.1;
docs/real-kernel-caches.md). What the provider does with real caches is tested against the real
kernel in tests/integration/test_guest_caches.py.
"""

from __future__ import annotations

import pytest

from upsguard.errors import PermanentError, TemporaryError
from upsguard.plugins.caches.lvmcache import DmCacheStatus, parse_lvs_json, parse_status

WRITE_BACK = (
    "0 1048576 cache 8 24/2048 128 2112/4096 0 0 14672 0 0 0 2112 2 metadata2 writeback "
    "2 migration_threshold 4096 smq 0 rw - "
)
CLEANER = (
    "0 1048576 cache 8 24/2048 128 2112/4096 0 0 157632 0 0 0 0 2 metadata2 writethrough "
    "2 migration_threshold 4096 cleaner 0 rw -"
)


def test_reads_dirty_blocks_mode_and_policy_from_dmsetup_status() -> None:
    assert parse_status(WRITE_BACK) == DmCacheStatus(
        block_bytes=64 * 1024, dirty_blocks=2112, mode="writeback", policy="smq",
        needs_check=False,
    )  # fmt: skip
    assert parse_status(CLEANER) == DmCacheStatus(
        block_bytes=64 * 1024, dirty_blocks=0, mode="writethrough", policy="cleaner",
        needs_check=False,
    )  # fmt: skip


def test_metadata_that_needs_a_check_is_told() -> None:
    assert parse_status(WRITE_BACK.replace("rw -", "ro needs_check")).needs_check


def test_a_failed_cache_is_a_permanent_error() -> None:
    with pytest.raises(PermanentError, match="failed"):
        parse_status("0 1048576 cache Fail")


def test_another_target_is_not_read_as_a_cache() -> None:
    with pytest.raises(TemporaryError, match="not a dm-cache status line"):
        parse_status("0 4192256 writecache 0 522247 489479 0 0 0 0 0 0 0 0 0 0 0")


def test_reads_lvs_json_report() -> None:
    text = """  {
      "report": [
          {
              "lv": [
                  {"lv_tags":"upsguard.policy:smq", "cache_policy":"cleaner"}
              ]
          }
      ]
  }
"""
    assert parse_lvs_json(text) == [{"lv_tags": "upsguard.policy:smq", "cache_policy": "cleaner"}]
    with pytest.raises(TemporaryError, match="no JSON report"):
        parse_lvs_json('  Volume group "vg" not found')
