"""The cache providers against the real kernel: bcache, dm-writecache and lvmcache (dm-cache) in
the QEMU guest, driven over SSH by ``upsguard cache`` with a site file that points at the guest.

For each cache the test writes a known pattern of dirty data through it in write-back mode,
checks that the provider reads the mode and the dirty bytes the kernel reports, flips it to
write-through with ``upsguard cache set write-through --wait`` and watches the dirty data fall
to zero, flips it back and checks that the user's own settings are back, and then proves that
nothing was lost: the cache is stopped *without* a flush of its own (bcache: the cache set is
stopped; dm-writecache and dm-cache: the cache's device-mapper device is removed) and the
backing device alone must hold exactly what was written.

The backing disk is slow to write (``Guest.slow_disk``: dm-delay, as a spindle behind an SSD
cache), so that a destage lasts long enough to be watched, and the dirty data is still there
when the provider first reads it (smq writes back all it holds within a second of idleness on
the guest's fast disks). A light read load runs throughout, as VMs keep reading on battery:
without any I/O bcache raises its writeback rate by itself and hides its trap
(docs/real-kernel-caches.md, where the facts these tests rely on are recorded).
Nothing here asserts how long anything took.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.peers.guest import SLOW_OFFSET, Guest
from tests.peers.service import CLI
from upsguard.config.types import parse_bytes

pytestmark = pytest.mark.guest

DATA_MB = 128
CLI_TIMEOUT = 600.0  # a safety net for one CLI call, never a measure
WRITE_DELAY_MS = 500  # the slow backing disk's
#: Where the slow disk's first byte lies on the raw disk: what "the backing device alone" reads.
RAW_OFFSET = SLOW_OFFSET * 512


@dataclass(frozen=True)
class Progress:
    """One line ``cache set --wait`` prints per poll when its output is not a terminal."""

    dirty: int
    rate: int
    eta: str
    clean: int
    total: int


_PROGRESS = re.compile(
    r"\] (?P<dirty>[\d.]+ \w+) dirty, (?P<rate>[\d.]+ \w+)/s, ETA (?P<eta>\S+), "
    r"(?P<clean>\d+)/(?P<total>\d+) clean"
)


def progress_lines(stderr: str) -> list[Progress]:
    found = []
    for line in stderr.splitlines():
        match = _PROGRESS.search(line)
        if match:
            found.append(
                Progress(
                    parse_bytes(match["dirty"].replace(" ", "")),
                    parse_bytes(match["rate"].replace(" ", "")),
                    match["eta"],
                    int(match["clean"]),
                    int(match["total"]),
                )
            )
    return found


@dataclass(frozen=True)
class Site:
    """A site file whose one cache the provider reaches in the guest over SSH."""

    path: Path
    cache: str

    def upsguard(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args, "-c", str(self.path)],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            check=False,
        )

    def status(self) -> dict[str, Any]:
        """The provider's one reading of the cache's one target (``cache status``)."""
        done = self.upsguard("cache", "status", "--format", "json", "--sample", "0")
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        assert len(rows) == 1, rows
        return rows[0]


def write_site(guest: Guest, tmp_path: Path, cache: dict[str, Any]) -> Site:
    ssh = {
        "host": guest.host,
        "port": guest.port,
        "user": guest.user,
        "key_file": str(guest.key_file),
        "known_hosts": str(guest.known_hosts),
    }
    config = {
        "site": "guest",
        "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "ups": "ups1"}}],
        "caches": [{"ssh": ssh, "poll_interval": "500ms", "destage_timeout": "3m", **cache}],
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return Site(path, cache["name"])


def reads_on(guest: Guest, device: str) -> None:
    """A light read load on ``device``: one direct 4 KiB read every 0.2 s."""
    guest.start_load(
        "reads", f"dd if={device} of=/dev/null bs=4k count=1 iflag=direct status=none; sleep 0.2"
    )


def check_read_as_write_back(site: Site, kernel_dirty: Any) -> dict[str, Any]:
    """The provider reads write-back and the dirty bytes the kernel reports. The kernel may
    write back a little by itself meanwhile, so its figure is read just before and just after
    the provider's; the provider's must lie between them."""
    before = kernel_dirty()
    seen = site.status()
    after = kernel_dirty()
    assert seen["mode"] == "write-back" and seen["clean"] is False, seen
    assert after <= seen["dirty_bytes"] <= before, (before, seen, after)
    assert seen["dirty_bytes"] > 0
    return seen


def flip_to_write_through_and_wait(site: Site, target: str) -> list[Progress]:
    """``cache set write-through --wait``: ok, progress falling to zero, clean."""
    done = site.upsguard("cache", "set", "write-through", "--wait")
    print(done.stderr)  # the progress lines, for whoever reads the test's output
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{site.cache}/{target}: ok: {target}: write-through",
        f"clean: {site.cache}",
    ]
    lines = progress_lines(done.stderr)
    assert lines, done.stderr
    dirty = [line.dirty for line in lines]
    assert dirty == sorted(dirty, reverse=True), dirty  # never rises: nothing new is cached
    assert dirty[0] > 0
    assert (lines[-1].dirty, lines[-1].clean, lines[-1].total) == (0, 1, 1)
    # Every reading taken while the drain was under way shows its rate and ETA.
    for line in lines:
        if 0 < line.dirty < dirty[0]:
            assert line.rate > 0 and line.eta != "?", line
    return lines


# --- bcache ---------------------------------------------------------------------------------

BCACHE = "/sys/block/bcache0/bcache"
_HPRINT_UNITS = {"k": 1, "M": 2, "G": 3, "T": 4}


def hprint_bytes(text: str) -> int:
    """The kernel's ``dirty_data`` (``0.0k``, ``99.0M``) in bytes."""
    text = text.strip()
    number, unit = float(text[:-1]), text[-1]
    return round(number * 1024 ** _HPRINT_UNITS[unit])


def make_bcache(guest: Guest, backing: str, cache: str) -> str:
    """bcache0 on ``backing``, cached by ``cache``, in write-back; returns its cache set UUID.
    Sequential writes are cached too (``sequential_cutoff`` 0) and congestion never bypasses
    the cache, so that every byte written is dirty in the cache first."""
    guest.check(f"make-bcache -B {backing} >/dev/null && make-bcache -C {cache} >/dev/null")
    guest.check(
        f"echo {backing} > /sys/fs/bcache/register && echo {cache} > /sys/fs/bcache/register"
    )
    cset = guest.check("cd /sys/fs/bcache && ls -d *-*-*-*-*").split()
    assert len(cset) == 1, cset
    guest.check(
        f"echo {cset[0]} > {BCACHE}/attach && echo writeback > {BCACHE}/cache_mode && "
        f"echo 0 > {BCACHE}/sequential_cutoff && "
        f"echo 0 > /sys/fs/bcache/{cset[0]}/congested_read_threshold_us && "
        f"echo 0 > /sys/fs/bcache/{cset[0]}/congested_write_threshold_us"
    )
    return cset[0]


def bcache_knobs(guest: Guest) -> dict[str, str]:
    names = ("cache_mode", "writeback_percent", "writeback_delay", "writeback_running")
    values = guest.check(" && ".join(f"cat {BCACHE}/{name}" for name in names)).splitlines()
    return dict(zip(names, values, strict=True))


def test_bcache_write_back_destage_and_no_byte_lost(clean_guest: Guest, tmp_path: Path) -> None:
    guest = clean_guest
    disk, cache, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    backing = guest.slow_disk(disk, WRITE_DELAY_MS)
    cset = make_bcache(guest, backing, cache)
    # The user's own tuning, which the provider changes while it destages and must put back.
    guest.check(f"echo 25 > {BCACHE}/writeback_percent && echo 7 > {BCACHE}/writeback_delay")
    user = bcache_knobs(guest)
    guest.check(f"dd if={source} of=/dev/bcache0 bs=1M count={DATA_MB} oflag=direct status=none")
    reads_on(guest, "/dev/bcache0")
    site = write_site(
        guest, tmp_path, {"name": "nas-ssd", "provider": "bcache", "state_dir": str(tmp_path)}
    )

    # 1. write-back, with the dirty bytes the kernel reports
    check_read_as_write_back(site, lambda: hprint_bytes(guest.check(f"cat {BCACHE}/dirty_data")))

    # 2. write-through through the provider, until clean
    flip_to_write_through_and_wait(site, "bcache0")
    assert guest.check(f"cat {BCACHE}/dirty_data").strip() == "0.0k"
    # clean: the user's writeback settings are back at once, in write-through
    assert bcache_knobs(guest) == {
        **user,
        "cache_mode": "[writethrough] writeback writearound none",
    }

    # 4. back to write-back: the user's settings are the ones in force
    done = site.upsguard("cache", "set", "write-back")
    assert done.returncode == 0, done.stderr
    assert bcache_knobs(guest) == user

    # 3. stop the cache set, which writes nothing back by itself: the backing device alone
    # must hold every byte, and its superblock must say it is clean.
    guest.stop_load("reads")
    guest.check(f"echo 1 > /sys/fs/bcache/{cset}/stop")
    gone = "ls -d /sys/fs/bcache/*-*-*-*-* /sys/block/bcache0 2>/dev/null | wc -l"
    assert guest.wait_for(gone, "0") == "0"
    super_block = guest.check(f"bcache-super-show {backing}")
    assert re.search(r"dev\.data\.cache_state\s+\d+ \[clean\]", super_block), super_block
    first = re.search(r"dev\.data\.first_sector\s+(\d+)", super_block)
    assert first, super_block
    assert guest.sha256(disk, DATA_MB, skip_bytes=RAW_OFFSET + int(first.group(1)) * 512) == want


# --- dm-writecache --------------------------------------------------------------------------

#: The user's own tuning (writecache.rst): the provider must give back exactly this table.
WRITECACHE_OPTIONS = "4 high_watermark 60 low_watermark 40"


def writecache_status(guest: Guest) -> tuple[int, int, int]:
    """(blocks, free blocks, blocks under writeback) of ``dmsetup status wc``."""
    words = guest.check("dmsetup status wc").split()
    assert words[2] == "writecache" and words[3] == "0", words  # no I/O error
    return int(words[4]), int(words[5]), int(words[6])


def test_writecache_write_back_destage_and_no_byte_lost(clean_guest: Guest, tmp_path: Path) -> None:
    guest = clean_guest
    disk, cache, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    origin = guest.slow_disk(disk, WRITE_DELAY_MS)
    sectors = int(guest.check(f"blockdev --getsz {origin}"))
    guest.check(
        f"dmsetup create wc --table '0 {sectors} writecache s {origin} {cache} 4096 "
        f"{WRITECACHE_OPTIONS}'"
    )
    table = guest.check("dmsetup table wc").strip()
    guest.check(f"dd if={source} of=/dev/mapper/wc bs=1M count={DATA_MB} oflag=direct status=none")
    reads_on(guest, "/dev/mapper/wc")
    site = write_site(guest, tmp_path, {"name": "pmem", "provider": "writecache"})

    def kernel_dirty() -> int:
        blocks, free, _ = writecache_status(guest)
        return (blocks - free) * 4096

    # 1.
    check_read_as_write_back(site, kernel_dirty)

    # 2. dm-writecache has no write-through: the provider's write-through is its cleaner
    flip_to_write_through_and_wait(site, "wc")
    blocks, free, writeback = writecache_status(guest)
    assert (free, writeback) == (blocks, 0)
    assert guest.check("dmsetup table wc").split()[-1] == "cleaner"

    # 4. back to write-back: the user's table, cleaner gone, caching again
    done = site.upsguard("cache", "set", "write-back")
    assert done.returncode == 0, done.stderr
    assert guest.check("dmsetup table wc").strip() == table
    assert site.status()["mode"] == "write-back"

    # 3. remove the cache device (a removal writes nothing back): the origin alone
    guest.stop_load("reads")
    guest.check("dmsetup remove wc")
    assert guest.sha256(disk, DATA_MB, skip_bytes=RAW_OFFSET) == want


# --- lvmcache (dm-cache) --------------------------------------------------------------------

LVS_FIELDS = "cache_mode,cache_policy,cache_settings,lv_tags"


def make_lvmcache(guest: Guest, slow: str, fast: str) -> None:
    """vg/origin on ``slow`` cached by a pool on ``fast``, write-back, with the user's own
    ``migration_threshold``. The VG's metadata lives on ``fast`` only, so that lvm's own
    writes never wait on the slow disk."""
    guest.check(
        f"pvcreate -q --metadatacopies 0 {slow} && pvcreate -q {fast} && "
        f"vgcreate -q vg {slow} {fast}"
    )
    guest.check(f"lvcreate -q -y -n origin -L 512M vg {slow}")
    guest.check(f"lvcreate -q -y --type cache-pool -n fast -L 256M vg {fast}")
    guest.check("lvconvert -q -y --type cache --cachepool vg/fast --cachemode writeback vg/origin")
    guest.check("lvchange -q --cachesettings migration_threshold=4096 vg/origin")


def dm_cache_status(guest: Guest) -> tuple[int, int, str]:
    """(dirty blocks, block size in bytes, mode) from ``dmsetup status vg-origin`` (kernel
    device-mapper/cache.rst): ``<md block> <used>/<total> <block sectors> <used>/<total> <read
    hits> <read misses> <write hits> <write misses> <demotions> <promotions> <dirty> <#feat>``."""
    words = guest.check("dmsetup status vg-origin").split()
    assert words[2] == "cache", words
    features = words[15 : 15 + int(words[14])]
    mode = next(w for w in features if w in ("writeback", "writethrough", "passthrough"))
    return int(words[13]), int(words[5]) * 512, mode


def lvs(guest: Guest, fields: str) -> list[str]:
    out = guest.check(f"lvs --noheadings --separator '|' -o {fields} vg/origin")
    return [word.strip() for word in out.strip().split("|")]


def test_lvmcache_write_back_destage_and_no_byte_lost(clean_guest: Guest, tmp_path: Path) -> None:
    guest = clean_guest
    disk, fast, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    make_lvmcache(guest, guest.slow_disk(disk, WRITE_DELAY_MS), fast)
    user = lvs(guest, LVS_FIELDS)
    assert user == ["writeback", "smq", "migration_threshold=4096", ""]
    guest.check(f"dd if={source} of=/dev/vg/origin bs=1M count={DATA_MB} oflag=direct status=none")
    reads_on(guest, "/dev/vg/origin")
    site = write_site(guest, tmp_path, {"name": "dmcache", "provider": "lvmcache"})

    def kernel_dirty() -> int:
        blocks, size, _ = dm_cache_status(guest)
        return blocks * size

    # 1.
    check_read_as_write_back(site, kernel_dirty)

    # 2.
    flip_to_write_through_and_wait(site, "vg/origin")
    dirty, _, mode = dm_cache_status(guest)
    assert (dirty, mode) == (0, "writethrough")

    # 4. back to write-back: the user's policy and settings, no trace of upsguard left
    done = site.upsguard("cache", "set", "write-back")
    assert done.returncode == 0, done.stderr
    assert lvs(guest, LVS_FIELDS) == user
    assert dm_cache_status(guest)[2] == "writeback"

    # 3. remove the cache's top device (a removal writes nothing back): its origin alone
    guest.stop_load("reads")
    guest.check("dmsetup remove vg-origin")
    assert guest.sha256("/dev/mapper/vg-origin_corig", DATA_MB) == want
