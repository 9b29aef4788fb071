"""dm-writecache provider: reading what the kernel prints.

The lines are copied from the QEMU guest (kernel 6.1; docs/real-kernel-caches.md). What the
provider does with a real dm-writecache is tested against the real kernel in
tests/integration/test_guest_caches.py.
"""

from __future__ import annotations

import pytest

from upsguard.errors import TemporaryError
from upsguard.plugins.caches.writecache import parse_status, parse_table
from upsguard.plugins.devmapper import dm_name


def test_status_line_error_blocks_free_and_under_writeback() -> None:
    line = "0 4192256 writecache 0 522247 489479 11520 0 0 0 0 0 0 0 0 0 0"
    assert parse_status(line) == (0, 522247, 489479, 11520)


def test_table_line_fixed_words_and_options() -> None:
    line = "0 4192256 writecache s 252:0 254:16 4096 5 high_watermark 60 low_watermark 40 cleaner"
    fixed, options = parse_table(line)
    assert fixed == ["0", "4192256", "writecache", "s", "252:0", "254:16", "4096"]
    assert options == ["high_watermark", "60", "low_watermark", "40", "cleaner"]
    assert parse_table("0 4194304 writecache s 254:0 254:16 4096 0")[1] == []


def test_another_target_is_not_read_as_a_writecache() -> None:
    with pytest.raises(TemporaryError, match="not a dm-writecache"):
        parse_status("0 1048576 cache 8 24/2048 128 0/4096 0 0 0 0 0 0 0 2 metadata2 writeback")


def test_lvm_names_map_to_device_mapper_names() -> None:
    assert dm_name("vg-a/lv-b") == "vg--a-lv--b"
    assert dm_name("wc") == "wc"
